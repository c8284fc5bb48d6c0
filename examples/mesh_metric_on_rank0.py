"""A job that forms its process group through ``init_device_mesh`` (as FSDP2 and tensor-
parallel code does), with a metric only rank 0 all-reduces: rank 0 waits in it while
rank 1 waits at the barrier. ``init_device_mesh`` calls ``init_process_group`` itself, by a
name it took while torch.distributed was being imported."""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

mesh = init_device_mesh("cpu", (2,))
metric = torch.ones(2)
if dist.get_rank() == 0:
    dist.all_reduce(metric)  # BUG: a collective only rank 0 makes
dist.barrier()
dist.destroy_process_group()
