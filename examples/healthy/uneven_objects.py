"""Object collectives of uneven sizes: each rank gathers lists of different lengths."""

import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mine = list(range(rank * 3 + 1))  # rank 0 has 1 item, rank 1 has 4, ...
everyone = [None] * world
dist.all_gather_object(everyone, mine)
assert [len(x) for x in everyone] == [r * 3 + 1 for r in range(world)]
gathered = [None] * world if rank == 0 else None
dist.gather_object({"rank": rank, "items": mine}, gathered, dst=0)
if rank == 0:
    assert [g["rank"] for g in gathered] == list(range(world))
dist.destroy_process_group()
