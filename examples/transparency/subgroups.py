"""Groups made three ways: ``new_subgroups`` (every rank calls it; each gets its own),
``new_group`` of every rank, and ``new_group(..., use_local_synchronization=True)`` called
only by the group's own members, which needs no call from anyone else."""

import torch
import torch.distributed as dist
from _digest import digest

dist.init_process_group("gloo")
rank = dist.get_rank()
world = dist.get_world_size()
mine, _ = dist.new_subgroups(group_size=2)
pair_sum = torch.tensor([float(rank)])
dist.all_reduce(pair_sum, group=mine)
everyone = dist.new_group(list(range(world)))
total = torch.tensor([1.0])
dist.all_reduce(total, group=everyone)
low = [r for r in range(world) if r < world // 2 + 1]
local_sum = torch.tensor([float(rank)])
if rank in low:
    local = dist.new_group(low, use_local_synchronization=True)
    dist.all_reduce(local_sum, group=local)
dist.barrier()
digest("subgroups", [pair_sum, total, local_sum])
dist.destroy_process_group()
