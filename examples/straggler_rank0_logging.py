"""Rank 0 logs every step to a metrics service that answers slowly (a stand-in: a sink
that blocks for 40 ms per record, as a remote logger on a slow network does). The log
call sits on the training step, so every other rank waits for rank 0's next backward."""

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class MetricsService:
    def log(self, record: dict) -> None:
        time.sleep(0.040)  # the service's round trip


def log_metrics(service: MetricsService, step: int, loss: torch.Tensor) -> None:
    service.log({"step": step, "loss": loss.item()})


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
service = MetricsService()
generator = torch.Generator().manual_seed(rank)
for step in range(40):
    x, y = torch.randn(32, 64, generator=generator), torch.randn(32, 1, generator=generator)
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    if rank == 0:
        log_metrics(service, step, loss)  # BUG: a blocking call on the step, on rank 0 only
dist.destroy_process_group()
