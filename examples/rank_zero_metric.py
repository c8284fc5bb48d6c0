"""Rank 0 all-reduces a metric of its own in the middle of the loop.

gloo pairs that all-reduce of 1 element with the others' next all-reduce of 4 and lets
rank 0 through; every rank then blocks at the loop's all-reduce, rank 0 in its #3 and the
others in their #2, and nothing in the calls blocked shows why: the history does (the
group's collective #2 differs).
"""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)
for step in range(3):
    dist.all_reduce(t)  # LOOP
    if rank == 0 and step == 1:
        dist.all_reduce(torch.ones(1))  # BUG: a metric only rank 0 reduces
dist.destroy_process_group()
