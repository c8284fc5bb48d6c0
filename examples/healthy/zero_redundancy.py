"""DDP with torch's ZeroRedundancyOptimizer (Adam's state sharded across the ranks)."""

import torch
import torch.distributed as dist
from _common import batches, model
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
ddp = DistributedDataParallel(model())
optimizer = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam,
                                    lr=0.01)
for x, y in batches():
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    optimizer.step()
dist.destroy_process_group()
