"""Rank 0 evaluates through the DDP wrapper, without torch.no_grad(): DDP's forward
broadcasts the buffers, a collective only rank 0 makes there. gloo pairs it with rank 1's
next training forward's broadcast (the same kind and size), so every number after it
means something else on each rank, and the job hangs a step later."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
model = DDP(net)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    loss = model(torch.randn(16, 8)).pow(2).mean()  # TRAIN
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if dist.get_rank() == 0 and step == 2:
        score = model(torch.randn(16, 8)).mean()  # BUG: model.module(...) or no_grad()
dist.destroy_process_group()
