"""FSDP2, and a checkpoint gathered on rank 0 alone: each full_tensor() is an all-gather
only rank 0 makes, while the others wait at the barrier."""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
fully_shard(net, mesh=mesh)
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
for step in range(3):
    net(torch.randn(16, 8)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
if dist.get_rank() == 0:
    state = {k: v.full_tensor() for k, v in net.state_dict().items()}  # BUG: rank 0 only
dist.barrier()  # WAIT
dist.destroy_process_group()
