"""A loop of all-reduces that also reduces a metric at step 1."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)
for step in range(3):
    dist.all_reduce(t)
    if rank == 0 and step == 1:
        metric = torch.ones(1)
        dist.all_reduce(metric)
        print(f"step {step}: metric {metric.item()}")
dist.destroy_process_group()
