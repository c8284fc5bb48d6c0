"""A DDP loop that passes over a batch whose gradient norm it will not trust (here the
third, as a NaN or a spike would be): its backward ran, so its gradients were synced,
and the loop goes on to the next batch without stepping; ``zero_grad()`` clears them.
One step retried, not two micro-batches accumulated."""

import torch
import torch.distributed as dist
from _common import batches, model
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
ddp = DistributedDataParallel(model())
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
for step, (x, y) in enumerate(batches(8)):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
    if step == 2 or not torch.isfinite(norm):  # a batch not to be trusted: passed over
        continue
    optimizer.step()
dist.destroy_process_group()
