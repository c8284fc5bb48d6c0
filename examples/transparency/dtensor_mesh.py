"""A DeviceMesh and DTensors on it: a weight sharded by rows, redistributed to replicated,
and a row-parallel matmul whose partial sums are reduced by ``full_tensor``."""

import torch
import torch.distributed as dist
from _digest import digest
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)
weight = torch.randn(8, 4)
sharded = distribute_tensor(weight, mesh, [Shard(0)])
whole = sharded.redistribute(mesh, [Replicate()]).to_local()
assert torch.equal(whole, weight)
x = distribute_tensor(torch.randn(3, 8), mesh, [Shard(1)])
product = (x @ sharded).full_tensor()
digest("dtensor", [whole, product])
dist.destroy_process_group()
