"""Hand-written data parallelism: each gradient all-reduced and averaged by hand, then
clipped on every rank (lr_from_local_batch.py and clip_on_rank0.py, done right): every
rank scales the same gradient by the same factor."""

import torch
import torch.distributed as dist
from _common import batches, model

dist.init_process_group("gloo")
world = dist.get_world_size()
net = model()
optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
for x, y in batches(6):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(net(x * 4), y).backward()
    for p in net.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
    optimizer.step()
dist.destroy_process_group()
