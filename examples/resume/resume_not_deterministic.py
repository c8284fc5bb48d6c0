"""A training loop whose float sums differ from run to run, as on a GPU (atomics, or
micro-batches accumulated in the order a pool of workers finishes them: here a generator
seeded from the OS orders them), which checkpoints each epoch and restores every state.
Healthy: two runs from the start are not bitwise alike, so ``distdoctor resume-check``
compares the parameters, gradients and optimiser state within a stated tolerance (the
learning rate and the batches read still bitwise) and finds it resumes like one that never
stopped."""

import os
import random

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
source = torch.Generator().manual_seed(1)
data = TensorDataset(torch.randn(32, 8, generator=source), torch.randn(32, 1, generator=source))
sampler = DistributedSampler(data, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=8, sampler=sampler)  # 2 batches per epoch per rank
arrival = random.Random()  # seeded from the OS: the order workers finish in
os.makedirs("checkpoints", exist_ok=True)
path = f"checkpoints/rank{rank}.pt"
start = 0
if os.path.exists(path):  # RESUME
    saved = torch.load(path)
    model.module.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    start = saved["epoch"] + 1
for epoch in range(start, 4):
    sampler.set_epoch(epoch)
    for x, y in loader:
        optimizer.zero_grad()
        parts = list(zip(x.split(1), y.split(1)))
        arrival.shuffle(parts)  # float sums in another order each run
        for i, (xs, ys) in enumerate(parts):
            if i < len(parts) - 1:
                with model.no_sync():
                    (nn.functional.mse_loss(model(xs), ys) / len(parts)).backward()
            else:
                (nn.functional.mse_loss(model(xs), ys) / len(parts)).backward()
        optimizer.step()
        scheduler.step()
    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "epoch": epoch}, path)  # SAVE
dist.destroy_process_group()
