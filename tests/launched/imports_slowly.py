"""A healthy script under torchrun that loads code for longer than a short deadline
between joining its group and its first call (DDP's first construction on a loaded
machine does): its own stall watch must see it moving, not hung."""

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jobs import load_slow_modules  # noqa: E402

dist.init_process_group("gloo")
load_slow_modules(12, 0.2)  # 2.4 s of loading; the test gives a 1 s deadline
x = torch.ones(1)
dist.all_reduce(x)
assert float(x) == dist.get_world_size()
dist.destroy_process_group()
