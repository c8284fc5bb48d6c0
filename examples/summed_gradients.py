"""Hand-written data parallelism that sums the gradients and never divides by N.

Each rank trains on its own data and all-reduces every gradient, but ReduceOp.SUM makes
the step N times too large: the loss still goes down, at N times the learning rate set.
"""

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
torch.manual_seed(0)  # one initialisation on every rank
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.randn(64, 8, generator=torch.Generator().manual_seed(dist.get_rank()))
for step in range(8):
    batch = data[step * 8:(step + 1) * 8]
    loss = model(batch).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)  # BUG: summed, never divided by dist.get_world_size()
    optimizer.step()
dist.destroy_process_group()
