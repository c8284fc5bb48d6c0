"""A model built from a setting read per rank (here, a width that rank 1 computes from its
own share of the data): DDP checks at construction that every rank holds the same model,
and raises on the ranks whose parameters' shapes differ."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
width = 16 if rank == 0 else 24  # BUG: a per-rank setting shapes the model
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Tanh(),
                                                    torch.nn.Linear(width, 1)))
print(f"rank {rank}: built")
dist.destroy_process_group()
