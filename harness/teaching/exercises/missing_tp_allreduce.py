"""Tensor parallelism with torch's parallelize_module: fc1 split by columns, fc2 by rows."""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)  # one model, cut across the ranks
model = nn.Sequential(nn.Linear(8, 24), nn.Tanh(), nn.Linear(24, 24), nn.Tanh(), nn.Linear(24, 1))
model = parallelize_module(model, mesh, {
    "0": ColwiseParallel(),
    "2": RowwiseParallel(output_layouts=Partial()),
})
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.randn(72, 8, generator=torch.Generator().manual_seed(0))  # the same batch everywhere
for step in range(6):
    batch = data[step * 12:(step + 1) * 12]
    loss = model(batch).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"rank {dist.get_rank()}, step {step}: loss {loss.item():.4f}")
dist.destroy_process_group()
