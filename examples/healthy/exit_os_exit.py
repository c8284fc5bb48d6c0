"""DDP training that leaves by os._exit(0) without tearing the process group down (as the
seed lessons' workers do, to skip a slow or hanging teardown): a finished rank."""

import os

import torch.distributed as dist
from _common import model, train
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
ddp = DistributedDataParallel(model())
train(ddp)
print(f"rank {dist.get_rank()} done", flush=True)
os._exit(0)
