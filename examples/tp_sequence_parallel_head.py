"""Sequence parallelism with parallelize_module, and a head left out of the plan.

fc2 reduce-scatters its output by rows (output_layouts=Shard(0)), so each rank goes on
with its own rows of the batch. The head is a plain layer every rank holds whole, but it
sees only those rows: its gradient on each rank is that rank's share, and nothing sums
the shares. The copies of the head drift apart step by step.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)  # one model, cut across the ranks
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))
model = parallelize_module(model, mesh, {
    "0": ColwiseParallel(),
    "2": RowwiseParallel(output_layouts=Shard(0)),  # each rank keeps its rows from here
})  # BUG: the head ("4") is left out; SequenceParallel() would sum its gradient
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))  # the same batch everywhere
for step in range(6):
    batch = data[step * 8:(step + 1) * 8]
    loss = model(batch).pow(2).mean()  # STEP: this rank's rows only
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
