"""A model of MLP and attention blocks trained as a pipeline (torch.distributed.pipelining,
GPipe), cut into one stage per rank."""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

SEQ, WIDTH, MICRO, MICRO_BATCHES = 64, 32, 2, 4


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.attention = nn.MultiheadAttention(WIDTH, 4, batch_first=True)

    def forward(self, x):
        y = self.norm(x)
        return x + self.attention(y, y, y, need_weights=False)[0]


def cost(layer: nn.Module) -> float:
    return sum(p.numel() for p in layer.parameters())


def cut(layers: list[nn.Module], stages: int) -> list[int]:
    """Where each stage starts, so that each holds an equal share of the total cost."""
    costs = [cost(layer) for layer in layers]
    starts, running = [0], 0.0
    for index, c in enumerate(costs):
        # a new stage starts at the layer that takes the running cost nearer past its share
        if len(starts) < stages and running + c / 2 > sum(costs) * len(starts) / stages:
            starts.append(index)
        running += c
    return starts + [len(layers)]


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
layers = [MLP() for _ in range(24)] + [Attention() for _ in range(24)]
bounds = cut(layers, world)
stage = PipelineStage(nn.Sequential(*layers[bounds[rank]:bounds[rank + 1]]), rank, world,
                      torch.device("cpu"))
schedule = ScheduleGPipe(stage, MICRO_BATCHES,
                         loss_fn=lambda out, target: nn.functional.mse_loss(out, target))
optimizer = torch.optim.SGD(stage.submod.parameters(), lr=0.01)
source = torch.Generator().manual_seed(1)
for step in range(8):
    x = torch.randn(MICRO * MICRO_BATCHES, SEQ, WIDTH, generator=source)
    y = torch.randn(MICRO * MICRO_BATCHES, SEQ, WIDTH, generator=source)
    optimizer.zero_grad()
    if rank == 0:
        schedule.step(x)
    elif rank == world - 1:
        schedule.step(target=y)
    else:
        schedule.step()
    optimizer.step()
dist.destroy_process_group()
