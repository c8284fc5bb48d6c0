"""A healthy DDP loop on two ranks, each pinned to a core of its own, where rank 1's core
also runs a busy loop (another job on the node, as on a shared CI runner): rank 1 arrives
late at every step because it waits for its CPU, not because its code does more."""

import os
import subprocess
import sys

import torch
import torch.distributed as dist
from torch import nn

rank = int(os.environ["RANK"])
os.sched_setaffinity(0, {rank})  # before any thread starts: torch's and gloo's inherit it
dist.init_process_group("gloo")
busy = None
if rank == 1:
    busy = subprocess.Popen([sys.executable, "-c", "import os\nos.sched_setaffinity(0, {1})\n"
                             "while True: pass"])
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(
    nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.Generator().manual_seed(rank)
for step in range(40):
    x = torch.randn(512, 256, generator=data)
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()
if busy is not None:
    busy.kill()
    busy.wait()
dist.destroy_process_group()
