"""Rank 1 waits in a loop for a condition only rank 0 could make true, while rank 0 waits
in an all_reduce for rank 1: one rank blocked in a collective, the other spinning in its
own code, never entering the call."""

import time

import torch
import torch.distributed as dist


def wait_until_ready(flags: dict) -> None:
    while not flags.get("ready"):  # BUG: nothing on this rank ever sets it
        time.sleep(0.001)


dist.init_process_group("gloo")
grad = torch.ones(8)
if dist.get_rank() == 1:
    wait_until_ready({})
dist.all_reduce(grad)
dist.destroy_process_group()
