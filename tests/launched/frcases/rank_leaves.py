"""Rank 1 leaves the training loop halfway; its process lingers (as a rank's does until
nccl's watchdog ends the job), so the others wait in the loop's all-reduce for it."""

import threading

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
for step in range(6):
    if dist.get_rank() == 1 and step == 3:
        break  # BUG: one rank leaves while the others still all-reduce
    dist.all_reduce(torch.ones(8))
threading.Event().wait()  # the process lingers, in no collective
