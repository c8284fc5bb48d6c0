"""torch's tensor parallelism (``parallelize_module``): a Megatron MLP block on a residual
stream, its norm sequence-parallel, dropout drawn alike on every rank, trained 3 steps."""

import torch
import torch.distributed as dist
from _digest import digest
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(8), nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(self.norm(x))
        return x + nn.functional.dropout(self.down(nn.functional.gelu(h)), 0.1)


dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)
model = parallelize_module(Block(), mesh, {
    "norm": SequenceParallel(sequence_dim=0),
    "up": ColwiseParallel(input_layouts=Shard(0)),
    "down": RowwiseParallel(output_layouts=Shard(0)),
})
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
generator = torch.Generator().manual_seed(7)
for _ in range(3):
    x = torch.randn(8, 8, generator=generator)
    rows = x.chunk(dist.get_world_size())[dist.get_rank()]
    loss = model(rows).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
digest("tensor-parallel", [p.to_local() if hasattr(p, "to_local") else p
                           for p in model.parameters()] + [loss.detach()])
dist.destroy_process_group()
