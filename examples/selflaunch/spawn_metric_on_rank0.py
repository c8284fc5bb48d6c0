"""The shape of PyTorch's DDP tutorial (ranks started by ``mp.spawn``), with its classic bug:
rank 0 averages the loss over the ranks for its log with an ``all_reduce`` that no other
rank makes. Rank 0 waits in it forever; rank 1 goes on to its next step, where DDP's own
collectives pair with nothing. Diagnose with ``distdoctor run -- python
spawn_metric_on_rank0.py``: the ranks are the two ``mp.spawn`` starts, not the parent.
"""

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def demo_basic(rank, world_size):
    setup(rank, world_size)
    torch.manual_seed(0)
    ddp_model = DDP(nn.Linear(10, 5))
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.001)
    for step in range(4):
        optimizer.zero_grad()
        loss = ddp_model(torch.randn(20, 10)).pow(2).mean()
        loss.backward()
        optimizer.step()
        if rank == 0:
            dist.all_reduce(loss.detach())  # BUG: a collective on rank 0 only
            print(f"step {step}: loss {loss.item() / world_size:.4f}")
    dist.destroy_process_group()


def free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return str(probe.getsockname()[1])


if __name__ == "__main__":
    os.environ.setdefault("MASTER_PORT", free_port())
    mp.spawn(demo_basic, args=(2,), nprocs=2, join=True)
