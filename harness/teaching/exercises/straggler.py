"""Train a small model with DDP, logging each step's loss to a metrics service."""

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class MetricsService:
    """Stands in for a remote metrics service: each record takes 40 ms to send."""

    def log(self, record: dict) -> None:
        time.sleep(0.040)


def log_metrics(service: MetricsService, step: int, loss: torch.Tensor) -> None:
    service.log({"step": step, "loss": loss.item()})


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
service = MetricsService()
generator = torch.Generator().manual_seed(rank)
for step in range(30):
    x, y = torch.randn(32, 64, generator=generator), torch.randn(32, 1, generator=generator)
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    if rank == 0:
        log_metrics(service, step, loss)
dist.destroy_process_group()
