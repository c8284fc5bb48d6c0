"""Each rank passes a tensor to its right neighbour and takes one from its left."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
outgoing, incoming = torch.full((1024,), float(rank)), torch.empty(1024)
dist.send(outgoing, dst=(rank + 1) % world)
dist.recv(incoming, src=(rank - 1) % world)
assert incoming[0].item() == (rank - 1) % world
dist.destroy_process_group()
