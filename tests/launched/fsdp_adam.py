"""FSDP2 with Adam on a model of four 64-wide layers, each layer and the whole sharded with
fully_shard: what a rank holds is its shard of every state (tests/test_memory_budget.py)."""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                      nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64))
for layer in model:
    if isinstance(layer, nn.Linear):
        fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
data = torch.randn(96, 64, generator=torch.Generator().manual_seed(dist.get_rank()))
for step in range(6):
    loss = model(data[step * 16:(step + 1) * 16]).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
