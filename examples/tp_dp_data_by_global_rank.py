"""Data parallel x 2-way tensor parallel on a DeviceMesh (4 ranks: 2 x 2): each
tensor-parallel pair holds one model (torch's parallelize_module), and the data-parallel
pairs average its gradients. The data is dealt out by DistributedSampler's defaults."""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size() // 2, 2), mesh_dim_names=("dp", "tp"))
torch.manual_seed(0)  # one model, cut across each tensor-parallel pair
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 1))
model = parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
generator = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(128, 8, generator=generator),
                     torch.randn(128, 1, generator=generator))
sampler = DistributedSampler(data, shuffle=False)
for x, y in DataLoader(data, batch_size=8, sampler=sampler):  # LOOP
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    for p in model.parameters():  # the data-parallel average of each rank's own slice
        grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        dist.all_reduce(grad, group=mesh["dp"].get_group())
        grad /= mesh["dp"].size()
    optimizer.step()
dist.destroy_process_group()
