"""Rank 1 validates its input with a regular expression that backtracks for minutes while
holding the GIL; rank 0 has already gone on to the next all-reduce and waits there. Not a
mismatch: rank 1 would make the same call, once its own work is done."""

import re

import torch
import torch.distributed as dist


def validate(text: str) -> bool:
    return re.match(r"(a+)+$", text) is not None  # BUG: exponential on a near-miss


dist.init_process_group("gloo")
grad = torch.ones(8)
dist.all_reduce(grad)
if dist.get_rank() == 1:
    validate("a" * 40 + "b")  # CHECK
dist.all_reduce(grad)  # WAIT
dist.destroy_process_group()
