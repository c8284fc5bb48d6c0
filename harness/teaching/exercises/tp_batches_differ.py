"""Tensor parallelism with torch's parallelize_module on a (data, tensor) mesh: data
parallelism comes later, so today every rank holds one slice of one model."""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (1, dist.get_world_size()), mesh_dim_names=("dp", "tp"))
torch.manual_seed(0)  # one model, cut across the ranks
model = nn.Sequential(nn.Linear(8, 24), nn.Tanh(), nn.Linear(24, 8), nn.Tanh(), nn.Linear(8, 1))
model = parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
generator = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(96, 8, generator=generator),
                     torch.randn(96, 1, generator=generator))
sampler = DistributedSampler(data, shuffle=True)  # as in our DDP recipe
loader = DataLoader(data, batch_size=8, sampler=sampler)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"rank {dist.get_rank()}, epoch {epoch}: last loss {loss.item():.4f}")
dist.destroy_process_group()
