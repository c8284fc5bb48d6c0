"""Data-parallel training with gradients averaged by hand."""

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.randn(64, 8, generator=torch.Generator().manual_seed(100 + dist.get_rank()))
for step in range(6):
    batch = data[step * 8:(step + 1) * 8]
    loss = model(batch).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    optimizer.step()
dist.destroy_process_group()
