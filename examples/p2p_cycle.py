"""Every rank sends to its right neighbour before receiving from its left: a cycle."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
outgoing, incoming = torch.full((1024,), float(rank)), torch.empty(1024)
dist.send(outgoing, dst=(rank + 1) % world)  # BUG: everyone sends first
dist.recv(incoming, src=(rank - 1) % world)
dist.destroy_process_group()
