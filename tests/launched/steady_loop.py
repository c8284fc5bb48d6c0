"""A healthy job that never ends: every rank all-reduces in a loop with no counter, so its
stacks look the same at every read (what ``attach`` must not call a hang). Run under
torchrun; the test stops it."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1024)
while True:
    dist.all_reduce(t)
    t.div_(dist.get_world_size())
