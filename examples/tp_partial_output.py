"""Tensor parallelism with torch's parallelize_module, whose second layer never sums.

fc1 is split by columns and fc2 by rows, the Megatron pair; but fc2's plan declares its
output Partial, and RowwiseParallel hands the next layer its local tensor: each rank
carries on with its own partial sum. Nothing fails and the loss goes down.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)  # one model, cut across the ranks
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))
model = parallelize_module(model, mesh, {
    "0": ColwiseParallel(),
    "2": RowwiseParallel(output_layouts=Partial()),  # BUG: never summed; Replicate() sums it
})
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))  # the same batch everywhere
for step in range(6):
    batch = data[step * 8:(step + 1) * 8]
    loss = model(batch).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
