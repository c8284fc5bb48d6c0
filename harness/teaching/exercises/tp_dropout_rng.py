"""Tensor parallelism with torch's parallelize_module: two Megatron MLP blocks on a
residual stream, dropout on each block's hidden layer and on its output, and a head every
rank holds whole."""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.drop_hidden, self.drop = nn.Dropout(0.1), nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.drop_hidden(nn.functional.gelu(self.up(x)))
        return x + self.drop(self.down(hidden))


dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)  # one model, cut across the ranks
model = nn.Sequential(Block(24), Block(24), nn.Linear(24, 1))
model = parallelize_module(model, mesh, {
    "0.up": ColwiseParallel(), "0.down": RowwiseParallel(),
    "1.up": ColwiseParallel(), "1.down": RowwiseParallel(),
})
torch.manual_seed(1 + rank)  # as in our DDP recipe: each replica draws its own dropout
optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
data = torch.randn(96, 24, generator=torch.Generator().manual_seed(0))  # the same batch everywhere
target = data.sum(dim=1, keepdim=True)
for step in range(6):
    batch = data[step * 16:(step + 1) * 16]
    loss = nn.functional.mse_loss(model(batch), target[step * 16:(step + 1) * 16])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"rank {rank}, step {step}: loss {loss.item():.4f}")
dist.destroy_process_group()
