"""``torch.distributed.pipelining``: a model split into one stage per rank, trained with
the GPipe schedule over 4 micro-batches."""

import torch
import torch.distributed as dist
from _digest import digest
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

dist.init_process_group("gloo")
rank = dist.get_rank()
world = dist.get_world_size()
torch.manual_seed(0)
layers = [torch.nn.Linear(4, 4) for _ in range(world)]
stage_module = layers[rank]
stage = PipelineStage(stage_module, rank, world, torch.device("cpu"))
schedule = ScheduleGPipe(stage, n_microbatches=4,
                         loss_fn=lambda out, target: torch.nn.functional.mse_loss(out, target))
optimizer = torch.optim.SGD(stage_module.parameters(), lr=0.1)
generator = torch.Generator().manual_seed(7)
for _ in range(2):
    x, y = torch.randn(8, 4, generator=generator), torch.randn(8, 4, generator=generator)
    optimizer.zero_grad()
    if rank == 0:
        schedule.step(x)
    elif rank == world - 1:
        schedule.step(target=y)
    else:
        schedule.step()
    optimizer.step()
digest("pipelining", stage_module.parameters())
dist.destroy_process_group()
