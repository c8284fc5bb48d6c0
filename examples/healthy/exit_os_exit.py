"""DDP training that leaves by os._exit(0) without tearing the process group down (as the
seed lessons' workers do, to skip a slow or hanging teardown): a finished rank."""

import os

import torch
import torch.distributed as dist
from _common import batches, model
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
ddp = DistributedDataParallel(model())
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
for x, y in batches():
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    optimizer.step()
print(f"rank {dist.get_rank()} done", flush=True)
os._exit(0)
