"""A distributed checkpoint (torch.distributed.checkpoint) that holds each rank's RNG
state under one key: DCP takes a plain tensor saved under the same key by every rank for
a replicated one and writes one copy, rank 0's. On load every rank gets rank 0's RNG
state, and rank 1's dropout draws rank 0's masks from the resume on."""

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.2),
                                              nn.Linear(16, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
torch.manual_seed(100 + rank)  # each rank's own dropout masks
start = 0
if os.path.exists("checkpoint/.metadata"):  # RESUME
    state = {"model": model.module.state_dict(), "rng": torch.get_rng_state(),
             "step": torch.tensor(0)}
    dcp.load(state, checkpoint_id="checkpoint")
    model.module.load_state_dict(state["model"])
    torch.set_rng_state(state["rng"])
    start = int(state["step"])
for step in range(start, 6):
    source = torch.Generator().manual_seed(1000 * step + rank)  # each step's own data
    x, y = torch.randn(8, 8, generator=source), torch.randn(8, 1, generator=source)
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 2 == 1:
        dcp.save({"model": model.module.state_dict(), "rng": torch.get_rng_state(),  # BUG
                  "step": torch.tensor(step + 1)}, checkpoint_id="checkpoint")
dist.destroy_process_group()
