"""The rank read from SLURM's variable, with a default: started by another launcher,
every process asks for rank 0, and the group never fills."""

import os

import torch
import torch.distributed as dist

rank = int(os.environ.get("SLURM_PROCID", "0"))  # BUG: torchrun and distdoctor set RANK
dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
value = torch.ones(4)
dist.all_reduce(value)
dist.destroy_process_group()
