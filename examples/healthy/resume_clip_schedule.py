"""Resume, clip and schedule done on every rank: the optimiser's checkpoint loaded by every
rank (resume_optimizer_on_rank0.py, done right), the gradient norm clipped on every rank
after DDP's sync (clip_on_rank0.py, done right) and the schedule stepped on every rank
(scheduler_on_rank_0.py, done right), with Adam, whose state every rank keeps alike."""

import os
import tempfile

import torch
import torch.distributed as dist
from _common import batches, model
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
checkpoint = os.path.join(tempfile.gettempdir(), f"resume_clip_schedule.{os.getppid()}.pt")
net = model()
optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
if rank == 0:  # the checkpoint an earlier run left: its moments and step counts
    saved = optimizer.state_dict()
    saved["state"] = {i: {"step": torch.tensor(3.0), "exp_avg": torch.full_like(p, 0.01),
                          "exp_avg_sq": torch.full_like(p, 1e-4)}
                      for i, p in enumerate(net.parameters())}
    torch.save({"optimizer": saved}, checkpoint)
dist.barrier()
optimizer.load_state_dict(torch.load(checkpoint)["optimizer"])  # on every rank
dist.barrier()
if rank == 0:
    os.remove(checkpoint)
ddp = DistributedDataParallel(net)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
for x, y in batches(6):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(ddp(x * 4), y).backward()
    norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), 0.5)  # every rank, after the sync
    if rank == 0:
        print(f"gradient norm {norm.item():.3f}")
    optimizer.step()
    scheduler.step()
dist.destroy_process_group()
