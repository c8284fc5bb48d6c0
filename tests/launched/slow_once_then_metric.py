"""Rank 1 is slow once (5 s of its own work, in quarter-second pieces between calls on a
group of its own, so it is never quiet for long) while rank 0 waits for it past a 2 s
deadline; later rank 0 alone all-reduces a metric (examples/rank_zero_metric.py's bug) and
the job hangs. Rank 0's watch stalls at the wait, sees it move on, and must write its real
hang down where it happens: the first stall's stacks are stale by then."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
alone = [dist.new_group([r]) for r in range(dist.get_world_size())][rank]
t = torch.ones(4)
dist.all_reduce(t)
if rank == 1:
    for _ in range(20):
        time.sleep(0.25)  # SLOW-ONCE
        dist.all_reduce(torch.ones(1), group=alone)
dist.all_reduce(t)  # WAITED
for step in range(3):
    dist.all_reduce(t)  # LOOP
    if rank == 0 and step == 1:
        dist.all_reduce(torch.ones(1))  # BUG: a metric only rank 0 reduces
dist.destroy_process_group()
