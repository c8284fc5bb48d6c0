"""What the healthy scripts share: a small model and each rank's own data."""

import torch
import torch.distributed as dist
from torch import nn


def model() -> nn.Module:
    torch.manual_seed(0)  # one initialisation on every rank
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def batches(steps: int = 4, size: int = 8):
    generator = torch.Generator().manual_seed(dist.get_rank())
    return [(torch.randn(size, 8, generator=generator), torch.randn(size, 1, generator=generator))
            for _ in range(steps)]


def train(ddp: nn.Module, steps: int = 4) -> None:
    """The ordinary loop: SGD on the rank's own batches through ``ddp``."""
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for x, y in batches(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
