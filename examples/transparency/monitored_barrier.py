"""``monitored_barrier``: rank 0 checks every rank in, then an ordinary barrier."""

from datetime import timedelta

import torch
import torch.distributed as dist
from _digest import digest

dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
dist.monitored_barrier(timeout=timedelta(seconds=60), wait_all_ranks=True)
dist.barrier()
digest("monitored-barrier", [total])
dist.destroy_process_group()
