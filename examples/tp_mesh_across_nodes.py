"""tp_dp_data_by_dp_rank.py with the device mesh's dimensions swapped, (tp, dp): on two
nodes of two ranks, each tensor-parallel pair takes one rank from each node (0 and 2, 1 and
3), so every all-reduce of its layers crosses the slow link, while the once-a-step
gradient average stays inside a node. Nothing fails; on one machine nothing is slow.
distdoctor names it (tp-across-nodes) from the nodes the launcher numbered."""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
# BUG: tensor parallelism as the outer dimension
mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2), mesh_dim_names=("tp", "dp"))
torch.manual_seed(0)  # one model, cut across each tensor-parallel pair
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 1))
model = parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
generator = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(128, 8, generator=generator),
                     torch.randn(128, 1, generator=generator))
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
