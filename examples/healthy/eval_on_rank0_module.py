"""Evaluation on rank 0 alone through model.module under no_grad: no collective."""

import torch
import torch.distributed as dist
from _common import batches, model
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
ddp = DistributedDataParallel(model())
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
held_out = torch.randn(16, 8)
for step, (x, y) in enumerate(batches()):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    optimizer.step()
    if dist.get_rank() == 0 and step % 2 == 1:
        with torch.no_grad():
            print(f"eval after step {step}: {ddp.module(held_out).mean().item():.4f}", flush=True)
dist.destroy_process_group()
