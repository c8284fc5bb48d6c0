"""BatchNorm under DDP with broadcast_buffers=False and no SyncBatchNorm: each rank keeps
the running statistics of its own batches, so the model each rank evaluates or saves
differs, while the parameters stay identical."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
model = DDP(net, broadcast_buffers=False)  # BUG: and no SyncBatchNorm
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.Generator().manual_seed(rank + 1)
for step in range(6):
    loss = model(torch.randn(16, 8, generator=data) + rank).pow(2).mean()  # FORWARD
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
