"""Object collectives: broadcast_object_list, all_gather_object, gather_object and
scatter_object_list, with objects of different sizes on each rank."""

import torch
import torch.distributed as dist
from _digest import digest

dist.init_process_group("gloo")
rank = dist.get_rank()
world = dist.get_world_size()
config = [{"lr": 0.1, "layers": [4, 8]} if rank == 0 else None]
dist.broadcast_object_list(config, src=0)
everyone = [None] * world
dist.all_gather_object(everyone, {"rank": rank, "words": "x" * (10 * rank)})
gathered = [None] * world if rank == 0 else None
dist.gather_object(rank * 2, gathered, dst=0)
mine = [None]
dist.scatter_object_list(mine, [i * 3 for i in range(world)] if rank == 0 else None, src=0)
assert config[0]["layers"] == [4, 8] and mine[0] == rank * 3
assert [each["rank"] for each in everyone] == list(range(world))
digest("objects", [torch.tensor([float(len(e["words"])) for e in everyone]),
                   torch.tensor([float(mine[0])])])
dist.destroy_process_group()
