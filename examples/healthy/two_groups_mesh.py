"""Two process groups from init_device_mesh, data- and tensor-parallel, at 4 ranks: each
rank averages gradients over its data-parallel group and sums activations over its
tensor-parallel group; the groups' collectives interleave in the same order everywhere."""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
torch.manual_seed(0)
weight = torch.randn(4, 4, requires_grad=True)  # this rank's tensor-parallel slice
x = torch.randn(2, 4, generator=torch.Generator().manual_seed(mesh.get_coordinate()[0]))
for step in range(3):
    partial = x @ weight
    total = partial.detach().clone()
    dist.all_reduce(total, group=tp)  # the row-parallel sum
    (partial * total).sum().backward()
    dist.all_reduce(weight.grad, group=dp)
    weight.grad /= dist.get_world_size(dp)
    with torch.no_grad():
        weight -= 0.01 * weight.grad
    weight.grad = None
dist.destroy_process_group()
