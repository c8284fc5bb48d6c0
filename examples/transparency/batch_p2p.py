"""A ring exchange through ``batch_isend_irecv``: each rank sends to the next and receives
from the previous in one batch, then waits every request."""

import torch
import torch.distributed as dist
from _digest import digest

dist.init_process_group("gloo")
rank = dist.get_rank()
world = dist.get_world_size()
send = torch.full((4,), float(rank))
received = torch.zeros(4)
for _ in range(3):
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % world),
           dist.P2POp(dist.irecv, received, (rank - 1) % world)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    send = received + 1
    received = torch.zeros(4)
digest("batch-p2p", [send])
dist.destroy_process_group()
