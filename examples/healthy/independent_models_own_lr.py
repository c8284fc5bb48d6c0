"""A learning-rate sweep: each rank trains a model of its own with its own learning rate
(no DDP, no gradient synchronisation), then the ranks all-reduce their final losses to
pick the best. Different settings and parameters by rank are the point here: these ranks
are no replicas."""

import torch
import torch.distributed as dist
from _common import batches, model

dist.init_process_group("gloo")
rank = dist.get_rank()
net = model()
optimizer = torch.optim.SGD(net.parameters(), lr=[0.3, 0.1, 0.03, 0.01][rank % 4],
                            momentum=0.9)
for x, y in batches(6):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(net(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    optimizer.step()
losses = torch.zeros(dist.get_world_size())
losses[rank] = loss.item()
dist.all_reduce(losses)
if rank == 0:
    print(f"best learning rate on rank {int(losses.argmin())}")
dist.destroy_process_group()
