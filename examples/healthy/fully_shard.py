"""FSDP2: fully_shard on a CPU device mesh, each layer sharded, then the whole model."""

import torch
import torch.distributed as dist
from _common import batches, model
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
net = model()
for layer in net:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer, mesh=mesh)
fully_shard(net, mesh=mesh)
optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
for x, y in batches():
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(net(x), y).backward()
    optimizer.step()
dist.destroy_process_group()
