"""One rank starts seconds after the others (a slow import, a large file read before
``init_process_group``), then all average a value together: a slow start-up, not a hang.
The others wait in ``init_process_group`` meanwhile, which no short deadline for the job
judges."""

import os
import time

import torch
import torch.distributed as dist

if os.environ["RANK"] == "1":
    time.sleep(3.0)  # stands in for a slow import on this rank's node
dist.init_process_group("gloo")
value = torch.full((4,), float(dist.get_rank()))
for step in range(4):
    dist.all_reduce(value)
    value /= dist.get_world_size()
dist.destroy_process_group()
