"""Gradient accumulation with every micro-batch inside ``no_sync()``, and the gradients
averaged by hand once the step's micro-batches are done, as trainers that choose when
their communication happens do: one all-reduce of each gradient, then divided by the
world size. The replicas apply one gradient, the mean of all their micro-batches."""

import torch
import torch.distributed as dist
from _common import batches, model
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
world = dist.get_world_size()
ddp = DistributedDataParallel(model())
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
data = batches(12)
for step in range(3):
    optimizer.zero_grad()
    with ddp.no_sync():
        for x, y in data[4 * step:4 * step + 4]:
            torch.nn.functional.mse_loss(ddp(x), y).backward()
    for p in ddp.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    optimizer.step()
dist.destroy_process_group()
