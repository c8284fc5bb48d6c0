"""DDP and ZeroRedundancyOptimizer under one Join: both are Joinable, so the ranks that
run out of data shadow the gradient all-reduces and the optimiser's parameter broadcasts."""

import torch
import torch.distributed as dist
from _digest import data, digest
from torch.distributed.algorithms.join import Join
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                                    torch.nn.Linear(8, 1)))
optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                    lr=0.01)
with Join([model, optimizer]):
    for x, y in data(rank, 3 + 2 * rank):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
digest("join-zero", model.parameters())
dist.destroy_process_group()
