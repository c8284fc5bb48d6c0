"""DDP under torch's Join context manager, the documented way to train on uneven inputs:
rank r trains 3 + r batches, and Join shadows the missing all-reduces of the ranks that ran
out. DDP hands the Work of its own all-reduce to C++ (``_set_forward_pass_work_handle``),
so any stand-in for torch's Work breaks it."""

import torch
import torch.distributed as dist
from _digest import data, digest
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
with Join([model]):
    for x, y in data(rank, 3 + rank):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
digest("join-ddp", model.parameters())
dist.destroy_process_group()
