"""A guard that skips the rest of a step when the loss is not finite, written as if every
rank saw the same loss: only rank 1 draws the bad batch, so it runs the forward and skips
the backward and the step, while rank 0 waits in DDP's gradient all-reduce for a rank that
has gone on to its next forward. The fix: agree across ranks first (all-reduce a "skip"
flag and skip on every rank), or make the loss finite on every rank."""

import math

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.Generator().manual_seed(rank)
for step in range(6):
    x, y = torch.randn(8, 4, generator=data), torch.randn(8, 1, generator=data)
    if rank == 1 and step == 3:
        x[0, 0] = float("nan")  # one bad sample, on one rank
    loss = torch.nn.functional.mse_loss(model(x), y)
    if not math.isfinite(loss.item()):
        continue  # BUG: this rank alone skips backward and step
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"rank {rank}: done")
dist.destroy_process_group()
