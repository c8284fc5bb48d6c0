"""Rank 1 hits a bad batch at step 2 and raises; the others then lose their peer."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
for step in range(5):
    batch = torch.randn(4, 8)
    if dist.get_rank() == 1 and step == 2:
        raise ValueError(f"corrupt batch at step {step}")  # BUG: the root cause
    dist.all_reduce(batch)
dist.destroy_process_group()
