"""Uneven inputs under DDP: rank 1's shard holds fewer batches than rank 0's, so after its
last batch rank 1 leaves the loop while rank 0 runs another forward and backward, whose
gradient all-reduce (made by DDP from C++) has no partner. torch's answer is the Join
context manager: a rank that ran out shadows the others' all-reduces until all are done."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
batches = [torch.randn(4, 8) for _ in range(5 if rank == 0 else 3)]  # BUG: uneven shards
for batch in batches:
    optimizer.zero_grad()
    model(batch).pow(2).mean().backward()  # BACKWARD
    optimizer.step()
print(f"rank {rank}: done")
dist.destroy_process_group()
