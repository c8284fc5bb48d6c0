"""FSDP2: ``fully_shard`` on each layer and on the whole model over a CPU mesh, trained a
few steps; the parameters gathered whole at the end."""

import torch
import torch.distributed as dist
from _digest import data, digest
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
for layer in (model[0], model[2]):
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
for x, y in data(dist.get_rank(), 4):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
digest("fsdp2", [p.full_tensor() for p in model.parameters()])
dist.destroy_process_group()
