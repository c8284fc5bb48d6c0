"""One rank does extra work every step: rank 2 also scores its batch with a second model
(a teacher, a metric, a check nobody removed) that the others never run. Everyone else
waits for it in DDP's gradient all-reduce."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def score_with_teacher(teacher: nn.Module, x: torch.Tensor) -> float:
    with torch.no_grad():
        for _ in range(30):
            x = torch.tanh(teacher(x))
    return float(x.mean())


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)))
teacher = nn.Linear(512, 512)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
generator = torch.Generator().manual_seed(rank)
for step in range(40):
    x, y = torch.randn(32, 64, generator=generator), torch.randn(32, 1, generator=generator)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    if rank == 2:
        score_with_teacher(teacher, torch.randn(256, 512))  # BUG: work only rank 2 does
dist.destroy_process_group()
