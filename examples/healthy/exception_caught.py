"""A rank that meets an exception in its own code, logs it and goes on: nothing crashed."""

import logging

import torch
import torch.distributed as dist
from _common import batches, model
from torch.nn.parallel import DistributedDataParallel

logging.basicConfig(level=logging.INFO, format="%(message)s")
dist.init_process_group("gloo")
ddp = DistributedDataParallel(model())
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
for step, (x, y) in enumerate(batches()):
    try:
        if dist.get_rank() == 1 and step == 2:
            raise ValueError("a metric that could not be computed")
    except ValueError as exc:
        logging.warning("rank %d step %d: %s (skipped)", dist.get_rank(), step, exc)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    optimizer.step()
dist.destroy_process_group()
