"""A group made only by its members: ranks 0 and 1 call ``new_group([0, 1])`` under a
rank condition, then every rank makes a group of everyone. torch's ``new_group`` is a
collective of the whole default group, so the ranks disagree on which group is which,
and the job waits forever in the second creation (or the first collective on it)."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank < 2:
    pair = dist.new_group([0, 1])  # BUG: only its members make it
everyone = dist.new_group(list(range(dist.get_world_size())))
total = torch.ones(1)
dist.all_reduce(total, group=everyone)
print(f"rank {rank}: {total.item()}")
dist.destroy_process_group()
