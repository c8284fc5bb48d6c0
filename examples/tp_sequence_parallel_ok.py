"""Sequence parallelism with parallelize_module, the head in the plan: SequenceParallel
makes its parameters replicated DTensors, so their gradients (each rank's rows' share) are
summed over the group, and the copies stay one. tp_sequence_parallel_head.py without it."""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))
model = parallelize_module(model, mesh, {
    "0": ColwiseParallel(),
    "2": RowwiseParallel(output_layouts=Shard(0)),
    "4": SequenceParallel(sequence_dim=0),  # the rows' gradients summed for the head
})
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
for step in range(6):
    batch = data[step * 8:(step + 1) * 8]
    loss = model(batch).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
