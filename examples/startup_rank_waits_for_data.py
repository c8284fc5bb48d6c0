"""Rank 1 waits for its data shard before it joins the group, and the shard is on another
node's disk: rank 0 waits in init_process_group for a rank that never calls it."""

import os
import time

import torch
import torch.distributed as dist

SHARD = f"/nonexistent/shards/part-{os.environ['RANK']}.pt"
if os.environ["RANK"] == "1":
    while not os.path.exists(SHARD):  # BUG: waits before joining, for a file never there
        time.sleep(0.05)
dist.init_process_group("gloo")
value = torch.ones(4)
dist.all_reduce(value)
dist.destroy_process_group()
