"""The last rank's shard is smaller, so it leaves the training loop early."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
batches = 6 if rank < world - 1 else 4  # BUG: uneven shards, no padding
weights = torch.zeros(16)
for step in range(batches):
    grad = torch.randn(16)
    dist.all_reduce(grad)
    weights -= 0.1 * grad / world
dist.destroy_process_group()
