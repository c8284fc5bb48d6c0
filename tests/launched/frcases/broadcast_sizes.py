"""Rank 0 broadcasts a buffer sized by its own config; the others size theirs by theirs.
gloo lets a broadcast into a longer buffer through (the tail keeps its zeros); nccl reads
past the end or hangs. Either way the sizes differ at one number of the group."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(3):
    dist.all_reduce(torch.ones(4))
table = torch.zeros(6 if rank == 0 else 8)  # BUG: the length depends on the rank's config
dist.broadcast(table, src=0)
dist.all_reduce(torch.ones(4))
dist.barrier()
