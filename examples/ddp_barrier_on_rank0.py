"""Rank 0 waits at a barrier before it saves; the other ranks go on to the next step's
backward, where DDP's gradient all-reduce (made from C++) waits for rank 0 in turn."""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    optimizer.zero_grad()
    loss = model(torch.randn(4, 8)).pow(2).mean()
    loss.backward()  # BACKWARD
    optimizer.step()
    if dist.get_rank() == 0 and step == 1:
        dist.barrier()  # BUG: only rank 0 waits here before "saving"
dist.destroy_process_group()
