"""A self-launching script (``torch.multiprocessing.start_processes``, forked ranks) that
trains twice, as a sweep does: one process group per learning rate. Its hand-written
data parallelism sums the gradients and never divides by the world size, so every step
is N times too large; nothing crashes.
``distdoctor run -- python spawn_summed_gradients.py`` tells the two process groups apart
and names the bug in each.
"""

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def train(rank: int, world_size: int, lr: float, port: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    torch.manual_seed(0)  # one initialisation on every rank
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    data = torch.randn(64, 8, generator=torch.Generator().manual_seed(rank))
    for step in range(8):
        loss = model(data[step * 8:(step + 1) * 8]).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)  # BUG: summed, never divided by the world size
        optimizer.step()
    dist.destroy_process_group()


def free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


if __name__ == "__main__":
    for lr in (0.05, 0.01):
        mp.start_processes(train, args=(2, lr, free_port()), nprocs=2, start_method="fork")
