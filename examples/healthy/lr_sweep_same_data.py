"""A learning-rate sweep on one dataset: every rank builds the same model from one seed,
reads the same batches, and trains with its own learning rate; only the losses are
all-reduced, each step, for the sweep's log. At the first step the ranks' gradients agree (same
parameters, same data), by coincidence and not by a sync: these ranks are no replicas,
and their different learning rates and parameters are the point of the sweep."""

import torch
import torch.distributed as dist
from _common import model

dist.init_process_group("gloo")
rank = dist.get_rank()
net = model()
optimizer = torch.optim.SGD(net.parameters(), lr=[0.3, 0.1, 0.03, 0.01][rank % 4])
data = torch.Generator().manual_seed(1234)  # one dataset for every run of the sweep
batches = [(torch.randn(8, 8, generator=data), torch.randn(8, 1, generator=data))
           for _ in range(6)]
for x, y in batches:
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(net(x), y)
    loss.backward()
    losses = torch.zeros(dist.get_world_size())  # every run's loss, for the sweep's log
    losses[rank] = loss.item()
    dist.all_reduce(losses)
    optimizer.step()
if rank == 0:
    print(f"best learning rate on rank {int(losses.argmin())}")
dist.destroy_process_group()
