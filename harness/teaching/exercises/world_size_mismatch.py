"""Average a value over the ranks, with the group set up from the cluster's config."""

import os

import torch
import torch.distributed as dist

CLUSTER = {"backend": "gloo", "world_size": 8}  # the config of the machine it was written for
dist.init_process_group(CLUSTER["backend"], rank=int(os.environ["RANK"]),
                        world_size=CLUSTER["world_size"])
value = torch.ones(4) * dist.get_rank()
dist.all_reduce(value)
print(f"rank {dist.get_rank()}: mean {value[0].item() / dist.get_world_size()}")
dist.destroy_process_group()
