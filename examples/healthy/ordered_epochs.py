"""A curriculum: the data is kept in one order on purpose (easy to hard) and dealt out
across the ranks by a DistributedSampler that does not shuffle, so every epoch reads it in
that order; ``set_epoch`` would change nothing."""

import torch
import torch.distributed as dist
from _common import model
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
generator = torch.Generator().manual_seed(0)
x = torch.randn(64, 8, generator=generator)
order = x.norm(dim=1).argsort()  # easy (small inputs) first
data = TensorDataset(x[order], torch.randn(64, 1, generator=generator)[order])
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
ddp = DistributedDataParallel(model())
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
for epoch in range(3):
    for inputs, targets in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp(inputs), targets).backward()
        optimizer.step()
dist.destroy_process_group()
