"""torch's mixed precision with loss scaling: DDP under autocast (bf16 on CPU), a
``GradScaler`` that scales the loss, unscales the gradients (by hand before a clipping
step, else inside ``scaler.step``), skips the step whose gradients overflow and halves
its scale, and grows it again every 2 clean steps."""

import torch
import torch.distributed as dist
from _digest import data, digest
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
for step, (x, y) in enumerate(data(dist.get_rank(), 6)):
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = nn.functional.mse_loss(model(x).float(), y)
    if step == 3:
        loss = loss * float("inf")  # an overflow: the scaler skips this step
    scaler.scale(loss).backward()
    if step == 4:
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    scaler.step(optimizer)
    scaler.update()
digest("amp-grad-scaler", [*model.parameters(), torch.tensor(scaler.get_scale())])
dist.destroy_process_group()
