"""Hand-written data parallelism (gradients all-reduced and averaged by hand) whose
learning rate is scaled by each rank's own batch size, and the ranks' shards are uneven
(100 samples over 3 ranks: 34, 33, 33): every rank averages the same gradient but steps
it with its own learning rate, so the replicas part from the first step.
"""

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
samples = torch.randn(100, 8, generator=torch.Generator().manual_seed(7))
mine = samples[rank::world]  # 34 on rank 0, 33 on the others
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * len(mine) / 32)  # BUG: own size
for step in range(5):
    optimizer.zero_grad()
    model(mine).pow(2).mean().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    optimizer.step()  # STEP
dist.destroy_process_group()
