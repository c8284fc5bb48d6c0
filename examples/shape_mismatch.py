"""Each rank all-reduces a buffer sized by its own data: the sizes differ."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
local_counts = torch.ones(4 + dist.get_rank())  # BUG: shape depends on the rank
dist.all_reduce(local_counts)
dist.destroy_process_group()
