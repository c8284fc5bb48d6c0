"""Asynchronous collectives waited for in the two ways torch offers: ``work.wait()`` and a
callback chained on ``work.get_future().then(...)``, whose value is waited for."""

import torch
import torch.distributed as dist
from _digest import digest

dist.init_process_group("gloo")
rank = dist.get_rank()
world = dist.get_world_size()
direct = torch.full((3,), float(rank + 1))
work = dist.all_reduce(direct, async_op=True)
assert work.wait()
assert type(work) is dist.Work, type(work)
chained = torch.arange(4.0) * (rank + 1)
future = dist.all_reduce(chained, async_op=True).get_future()
halved = future.then(lambda done: done.value()[0] / world).wait()
gathered = [torch.zeros(2) for _ in range(world)]
works = [dist.all_gather(gathered, torch.full((2,), float(rank)), async_op=True),
         dist.broadcast(torch.ones(1), src=0, async_op=True)]
for each in works:
    each.wait()
    assert each.is_completed()
digest("async", [direct, halved, *gathered])
dist.destroy_process_group()
