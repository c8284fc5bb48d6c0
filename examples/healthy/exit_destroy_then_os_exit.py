"""DDP training, destroy_process_group(), then os._exit(0): a finished rank."""

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
dist.barrier()
dist.destroy_process_group()
os._exit(0)
