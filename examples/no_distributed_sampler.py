"""Data parallel training whose ranks all read the whole dataset in the same order.

Every rank seeds torch the same way and shuffles with a plain DataLoader, so the N ranks
train N times on identical batches: N times the compute for one rank's progress.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

dist.init_process_group("gloo")
torch.manual_seed(0)  # the same seed on every rank: the same model, and the same shuffle
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
loader = DataLoader(data, batch_size=8, shuffle=True)  # BUG: no DistributedSampler
model = nn.parallel.DistributedDataParallel(nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(2):
    for x, y in loader:  # LOOP
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
dist.destroy_process_group()
