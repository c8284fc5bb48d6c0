"""DDP with a DistributedSampler that is never told the epoch: every epoch replays the first.

The loss still goes down, nothing crashes: each rank just sees its shard in the same order
every epoch. distdoctor run names it (repeated-epoch-order) and the loop to fix.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
sampler = DistributedSampler(data, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=8, sampler=sampler)
model = nn.parallel.DistributedDataParallel(nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(3):
    # BUG: sampler.set_epoch(epoch) is missing, so the shuffle repeats
    for x, y in loader:  # LOOP
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
dist.destroy_process_group()
