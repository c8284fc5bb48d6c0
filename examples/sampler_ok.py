"""The healthy counterpart: DistributedSampler with set_epoch for training, and an
evaluation loader every rank reads whole (shared by design, and not a finding)."""

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
sampler = DistributedSampler(data, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=8, sampler=sampler)
evaluation = DataLoader(data, batch_size=16)
model = nn.parallel.DistributedDataParallel(nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(3):
    sampler.set_epoch(epoch)
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        total = sum(nn.functional.mse_loss(model(x), y).item() for x, y in evaluation)
dist.destroy_process_group()
