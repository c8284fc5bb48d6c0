"""PyTorch's DDP tutorial as written (``mp.spawn``, the loss logged on rank 0 without a
collective): the healthy twin of ``examples/selflaunch/spawn_metric_on_rank0.py``. Self-launching:
run it with ``distdoctor run -- python spawn_tutorial.py``."""

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def demo_basic(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    ddp_model = DDP(nn.Linear(10, 5))
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.001)
    for step in range(4):
        optimizer.zero_grad()
        loss = ddp_model(torch.randn(20, 10)).pow(2).mean()
        loss.backward()
        optimizer.step()
        if rank == 0:
            print(f"step {step}: loss {loss.item():.4f} (rank 0's own batch)")
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        os.environ.setdefault("MASTER_PORT", str(probe.getsockname()[1]))
    mp.spawn(demo_basic, args=(2,), nprocs=2, join=True)
