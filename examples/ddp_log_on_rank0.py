"""Rank 0 all-reduces its loss for the log; the other ranks go on to DDP's next step, whose
own collectives (made from C++, never through torch.distributed's Python functions) can
never pair with it."""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(nn.Linear(16, 16))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    optimizer.zero_grad()
    loss = model(torch.randn(8, 16)).pow(2).mean()  # FORWARD
    loss.backward()
    optimizer.step()
    if dist.get_rank() == 0:
        dist.all_reduce(loss.detach())  # BUG: a collective only rank 0 makes
dist.destroy_process_group()
