"""FSDP2: rank 0 gathers a full copy of the weights for a checkpoint in the middle of
training; the other ranks go on with the next step."""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)
net = torch.nn.Linear(8, 8, bias=False)
fully_shard(net, mesh=mesh)
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
for step in range(4):
    net(torch.randn(16, 8)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    if dist.get_rank() == 0 and step == 1:
        state = {k: v.full_tensor() for k, v in net.state_dict().items()}  # BUG: rank 0 only
dist.destroy_process_group()
