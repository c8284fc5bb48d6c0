"""Rank 1 decides it is done halfway through and exits."""

import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
for step in range(6):
    if dist.get_rank() == 1 and step == 3:
        sys.exit(0)  # BUG: one rank leaves while the others still all-reduce
    dist.all_reduce(torch.ones(8))
dist.destroy_process_group()
