"""Each node reads its rendezvous port from a config of its own, and one says another
port: the ranks wait at two stores, each for a group that never fills."""

import os

import torch
import torch.distributed as dist

NODE_PORTS = {"0": os.environ["MASTER_PORT"], "1": "29511"}  # BUG: node 1's is stale
os.environ["MASTER_PORT"] = NODE_PORTS[os.environ["RANK"]]
dist.init_process_group("gloo")
value = torch.ones(4)
dist.all_reduce(value)
dist.destroy_process_group()
