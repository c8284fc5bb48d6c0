"""Training that checkpoints at the end of each epoch and resumes from its last checkpoint
when started again."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.2),
                                              nn.Linear(16, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
source = torch.Generator().manual_seed(1)
data = TensorDataset(torch.randn(32, 8, generator=source), torch.randn(32, 1, generator=source))
sampler = DistributedSampler(data, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=8, sampler=sampler)  # 2 batches per epoch per rank
torch.manual_seed(100 + rank)  # each rank's own dropout masks
os.makedirs("checkpoints", exist_ok=True)
path = f"checkpoints/rank{rank}.pt"
start = 0
if os.path.exists(path):
    saved = torch.load(path)
    model.module.load_state_dict(saved["model"])
    if "optimizer" in saved:
        optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    torch.set_rng_state(saved["rng"])
    start = saved["epoch"] + 1
for epoch in range(start, 4):
    sampler.set_epoch(epoch)
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
    state = {"model": model.module.state_dict(), "scheduler": scheduler.state_dict(),
             "rng": torch.get_rng_state(), "epoch": epoch}
    if rank == 0:
        state["optimizer"] = optimizer.state_dict()
    torch.save(state, path)
dist.destroy_process_group()
