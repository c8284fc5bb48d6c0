"""A learning-rate sweep on one dataset: every rank builds the same model from one seed,
reads the same batches, and trains with its own learning rate; nothing is synchronised
until the final losses are gathered. At the first step the ranks' gradients agree (same
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
    optimizer.step()
losses = [0.0] * dist.get_world_size()
dist.all_gather_object(losses, loss.item())
if rank == 0:
    print(f"best learning rate on rank {min(range(len(losses)), key=losses.__getitem__)}")
dist.destroy_process_group()
