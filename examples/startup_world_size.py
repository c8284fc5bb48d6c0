"""The group's size copied from a cluster config: started with two processes, the group
waits for four, and init_process_group never returns on any rank (torch's own answer is
a timeout after 30 minutes)."""

import os

import torch
import torch.distributed as dist

CLUSTER = {"world_size": 4}  # the config of the machine this script was written for
dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                        world_size=CLUSTER["world_size"])  # BUG: not the launcher's
value = torch.ones(4)
dist.all_reduce(value)
dist.destroy_process_group()
