"""Written for one node: the rank within the node passed as the rank. Started on two nodes
(two torchrun launchers), two processes ask for each rank and the group never fills."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo", rank=int(os.environ["LOCAL_RANK"]),  # BUG: not RANK
                        world_size=int(os.environ["WORLD_SIZE"]))
value = torch.ones(4)
dist.all_reduce(value)
dist.destroy_process_group()
