"""DDP training on data that holds one corrupt record: a NaN feature.

DistributedSampler deals record 21 to rank 1, in its third batch. Rank 1's loss and its
gradients turn NaN, DDP's all-reduce hands the NaN to rank 0, and from step 3 on both
ranks train on NaN parameters: no error anywhere, only a loss that prints as nan.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
torch.manual_seed(0)  # the same data and initial weights on every rank
features, targets = torch.randn(64, 8), torch.randn(64, 1)
features[21, 3] = float("nan")  # BUG: one corrupt record in the data
data = TensorDataset(features, targets)
loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=False))
model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for x, y in loader:
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()  # BACKWARD
    optimizer.step()
dist.destroy_process_group()
