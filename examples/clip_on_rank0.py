"""The gradient norm logged on rank 0 with clip_grad_norm_ (which returns the norm, and
clips): the synchronised gradient is clipped on rank 0 only, rank 1 applies it whole,
and the replicas part from the first step while the loss goes down on both.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.Generator().manual_seed(rank)
for step in range(6):
    optimizer.zero_grad()
    loss = model(torch.randn(8, 8, generator=data) * 4).pow(2).mean()
    loss.backward()
    if rank == 0:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # BUG: rank 0 only
        print(f"step {step}: loss {loss.item():.3f}, gradient norm {norm.item():.3f}")
    optimizer.step()  # STEP
dist.destroy_process_group()
