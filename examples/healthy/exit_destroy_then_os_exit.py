"""DDP training, destroy_process_group(), then os._exit(0): a finished rank."""

import os

import torch.distributed as dist
from _common import model, train
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
ddp = DistributedDataParallel(model())
train(ddp)
dist.barrier()
dist.destroy_process_group()
os._exit(0)
