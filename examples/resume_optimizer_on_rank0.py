"""Resuming DDP training where only rank 0 loads the optimiser's checkpoint (as in
vllm-project/speculators#926): the model is loaded on rank 0 too, but DDP broadcasts
rank 0's parameters when it wraps the model, so they agree; nothing broadcasts the
optimiser's state. Rank 0 resumes with the saved momentum, rank 1 with none: the same
averaged gradient becomes two different updates, and the replicas part at the first step.
"""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def build() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    return net, torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)


dist.init_process_group("gloo")
rank = dist.get_rank()
checkpoint = sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.gettempdir(),
                                                               "resume_optimizer.pt")
if rank == 0:  # the checkpoint an earlier run left: its model, and its optimiser's momentum
    net, optimizer = build()
    saved = optimizer.state_dict()
    saved["state"] = {i: {"momentum_buffer": torch.full_like(p, 0.1)}
                      for i, p in enumerate(net.parameters())}
    torch.save({"model": net.state_dict(), "optimizer": saved}, checkpoint)
dist.barrier()

net, optimizer = build()
if rank == 0:
    state = torch.load(checkpoint)
    net.load_state_dict(state["model"])  # broadcast by DDP below: fine
    optimizer.load_state_dict(state["optimizer"])  # BUG: rank 0's momentum alone
model = DistributedDataParallel(net)
data = torch.Generator().manual_seed(rank)
for step in range(6):
    optimizer.zero_grad()
    model(torch.randn(8, 8, generator=data)).pow(2).mean().backward()
    optimizer.step()  # STEP
dist.barrier()
if rank == 0:
    os.remove(checkpoint)
dist.destroy_process_group()
