"""A DDP training script of 1.05M parameters for bench/run_overhead.py: a loader with a
DistributedSampler, an SGD step per batch; rank 0 writes its CPU seconds per step
(after warm-up) to the path given as the first argument."""

import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

WARM_UP = 5

dist.init_process_group("gloo")
torch.manual_seed(0)
steps = int(sys.argv[2])
samples = 64 * (steps + WARM_UP)
data = TensorDataset(torch.randn(samples, 512), torch.randn(samples, 1))
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=32, sampler=sampler)
model = DistributedDataParallel(nn.Sequential(
    nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
    nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
sampler.set_epoch(0)
for i, (x, y) in enumerate(loader):
    if i == WARM_UP:
        dist.barrier()
        start = time.process_time()
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
cpu = (time.process_time() - start) / (i + 1 - WARM_UP)
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as out:
        out.write(repr(cpu))
dist.destroy_process_group()
