"""Training with the parameters sharded across the ranks (ZeRO-3, by hand): each rank
keeps the master copy of its own slice of the parameters and its optimiser updates that
slice; before each step the ranks gather the slices into the whole model. It saves a
distributed checkpoint every other step and, when started again, resumes from the last
one."""

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
params = list(model.parameters())
size = sum(p.numel() for p in params)
per_rank = -(-size // world)  # each rank's slice, the last one padded
whole = torch.zeros(per_rank * world)
whole[:size] = parameters_to_vector(params).detach()
shard = nn.Parameter(whole[rank * per_rank:(rank + 1) * per_rank].clone())
optimizer = torch.optim.SGD([shard], lr=0.1)


def gather_model() -> None:
    slices = [torch.zeros(per_rank) for _ in range(world)]
    dist.all_gather(slices, shard.detach())
    vector_to_parameters(torch.cat(slices)[:size], params)


def checkpoint(step: int) -> dict:
    return {"shard": shard, "step": torch.tensor(step)}


start = 0
if os.path.exists("checkpoint/.metadata"):
    state = checkpoint(0)
    dcp.load(state, checkpoint_id="checkpoint")  # into the tensors in place
    start = int(state["step"])
for step in range(start, 6):
    gather_model()
    source = torch.Generator().manual_seed(1000 * step + rank)  # each rank's own data
    x, y = torch.randn(8, 8, generator=source), torch.randn(8, 1, generator=source)
    model.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    grad = torch.zeros(per_rank * world)
    grad[:size] = parameters_to_vector([p.grad for p in params])
    dist.all_reduce(grad)
    shard.grad = grad[rank * per_rank:(rank + 1) * per_rank] / world
    optimizer.step()
    if step % 2 == 1:
        dcp.save(checkpoint(step + 1), checkpoint_id="checkpoint")
dist.destroy_process_group()
