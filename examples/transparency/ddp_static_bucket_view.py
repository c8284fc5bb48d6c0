"""DDP with ``static_graph=True`` and ``gradient_as_bucket_view=True`` together: the
gradients are views into DDP's buckets, and the graph is recorded once and reused."""

import torch
import torch.distributed as dist
from _digest import data, digest
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)),
    static_graph=True, gradient_as_bucket_view=True)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in data(dist.get_rank(), 5):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
digest("static-bucket-view", model.parameters())
dist.destroy_process_group()
