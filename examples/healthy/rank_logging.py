"""Rank-dependent printing and logging, with no collective in the branches."""

import logging

import torch
import torch.distributed as dist
from _common import batches, model
from torch.nn.parallel import DistributedDataParallel

logging.basicConfig(level=logging.INFO, format="%(message)s")
dist.init_process_group("gloo")
rank = dist.get_rank()
ddp = DistributedDataParallel(model())
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
for step, (x, y) in enumerate(batches()):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    loss.backward()
    optimizer.step()
    if rank == 0:
        logging.info("step %d loss %.4f", step, loss.item())
    elif step % 2:
        print(f"rank {rank}: step {step}", flush=True)
dist.destroy_process_group()
