"""Data parallel x 2-way tensor parallel on a DeviceMesh, on two nodes of two ranks each:
each tensor-parallel pair holds one model (torch's parallelize_module), and the
data-parallel pairs average its gradients. The data is dealt out by data-parallel rank."""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2), mesh_dim_names=("tp", "dp"))
torch.manual_seed(0)  # one model, cut across each tensor-parallel pair
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 1))
model = parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
generator = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(64, 8, generator=generator),
                     torch.randn(64, 1, generator=generator))
dp = mesh["dp"]  # each tensor-parallel pair reads one batch
sampler = DistributedSampler(data, num_replicas=dp.size(), rank=dp.get_local_rank(), shuffle=False)
for x, y in DataLoader(data, batch_size=8, sampler=sampler):
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    for p in model.parameters():  # the data-parallel average of each rank's own slice
        grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        dist.all_reduce(grad, group=mesh["dp"].get_group())
        grad /= mesh["dp"].size()
    optimizer.step()
dist.destroy_process_group()
