"""DDP whose learning-rate schedule is stepped on rank 0 only (inside a logging block).

Every rank averages the same gradient, but from the 10th step rank 0 applies it at half
the learning rate: the replicas part silently, and the loss still goes down.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=9, gamma=0.5)
data = torch.randn(14 * 8, 8, generator=torch.Generator().manual_seed(100 + dist.get_rank()))
for step in range(14):
    loss = model(data[step * 8:(step + 1) * 8]).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()  # STEP
    if dist.get_rank() == 0:
        print(f"step {step}: loss {loss.item():.4f}")
        scheduler.step()  # BUG: the schedule advances on rank 0 alone
dist.destroy_process_group()
