"""Data-parallel training with Adam, each rank given 240 KB for its training state (as a
GPU's memory would bound it): parameters, gradients and Adam's two moments, all whole on
every rank."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(
    nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
    nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64)))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
data = torch.randn(96, 64, generator=torch.Generator().manual_seed(rank))
for step in range(6):
    batch = data[step * 16:(step + 1) * 16]
    loss = model(batch).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if rank == 0:
        print(f"step {step}: loss {loss.item():.4f}")
dist.destroy_process_group()
