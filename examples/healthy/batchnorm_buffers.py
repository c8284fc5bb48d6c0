"""BatchNorm under DDP, its buffers kept alike: broadcast from rank 0 at each forward (DDP's
default; SyncBatchNorm, the other way, needs GPUs), and an evaluation on rank 0 through
the module, which updates nothing."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
model = DDP(net)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.Generator().manual_seed(rank + 1)
for step in range(6):
    loss = model(torch.randn(16, 8, generator=data) + rank).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if rank == 0 and step == 3:  # evaluation on rank 0, through the module: no collective
        model.module.eval()
        with torch.no_grad():
            model.module(torch.randn(4, 8))
        model.module.train()
dist.destroy_process_group()
