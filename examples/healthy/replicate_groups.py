"""HSDP's shape written with DDP: 4 ranks in two replicate groups, {0, 2} and {1, 3}, each
a DDP over its own group, holding a different model (as two shards would); the loss is
averaged over every rank for the log. Replicas agree within their group, and the two
groups never were alike."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
replicate = [dist.new_group([0, 2]), dist.new_group([1, 3])][rank % 2]
torch.manual_seed(rank % 2)  # each replicate group its own model
model = DistributedDataParallel(torch.nn.Sequential(
    torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)), process_group=replicate)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.Generator().manual_seed(rank)
for _ in range(6):
    x, y = torch.randn(8, 4, generator=data), torch.randn(8, 1, generator=data)
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    logged = loss.detach().clone()
    dist.all_reduce(logged)
if rank == 0:
    print(f"mean loss {logged.item() / dist.get_world_size():.4f}")
dist.destroy_process_group()
