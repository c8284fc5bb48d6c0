"""``all_to_all_single`` with uneven splits, as expert-parallel dispatch uses it: rank r
sends r + 1 + j elements to rank j, and each rank sizes its output from the others'."""

import torch
import torch.distributed as dist
from _digest import digest

dist.init_process_group("gloo")
rank = dist.get_rank()
world = dist.get_world_size()
send_splits = [rank + 1 + j for j in range(world)]
receive_splits = [r + 1 + rank for r in range(world)]
source = torch.arange(float(sum(send_splits))) + 100 * rank
output = torch.empty(sum(receive_splits))
dist.all_to_all_single(output, source, receive_splits, send_splits)
digest("all-to-all", [output])
dist.destroy_process_group()
