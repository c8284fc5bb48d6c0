"""Only rank 0 all-reduces its metrics; every rank then meets at a barrier."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
metrics = torch.tensor([float(dist.get_rank())])
if dist.get_rank() == 0:
    dist.all_reduce(metrics)  # BUG: a collective only rank 0 calls
dist.barrier()
dist.destroy_process_group()
