"""DistributedDataParallel with gradients accumulated over four micro-batches a step, only
the last of which synchronises."""

import contextlib

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.Tanh(),
                                                          nn.Linear(16, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.randn(128, 8, generator=torch.Generator().manual_seed(dist.get_rank()))
for step in range(4):
    for micro in range(4):
        optimizer.zero_grad()
        batch = data[(step * 4 + micro) * 8:(step * 4 + micro + 1) * 8]
        with model.no_sync() if micro < 3 else contextlib.nullcontext():
            loss = model(batch).pow(2).mean() / 4
            loss.backward()
    optimizer.step()
dist.destroy_process_group()
