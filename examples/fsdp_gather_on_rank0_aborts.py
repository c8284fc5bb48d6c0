"""FSDP2, a checkpoint gathered on rank 0 alone, while the others gather a metric of
their own: the two all-gathers differ in size, and gloo aborts rank 0 ("Received data
size doesn't match expected size"). Neither all-gather of rank 0 is traced (DTensor makes
them), so the abort itself is read as the collective mismatch it is."""

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
else:
    metric = torch.zeros(2 * 700)
    dist.all_gather_into_tensor(metric, torch.ones(700))
dist.destroy_process_group()
