"""A hand-written tree broadcast (a course's lesson: the value spreads from rank 0, each
holder sending to one new rank per round, until a bitmask says every rank holds it),
called with another source. Only rank 0's value ever starts the spread, so for src=3
no rank sends, and every rank spins in the loop: its bitmask shift grows without end,
in pure Python, never entering a send or receive."""

import torch
import torch.distributed as dist


def tree_broadcast(x: torch.Tensor, src: int) -> torch.Tensor:
    n, r = dist.get_world_size(), dist.get_rank()
    has_value = {0}  # BUG: the tree grows from rank 0, whatever src is
    seen = 1
    while len(has_value) < n:
        seen = seen << 1  # a bitmask of the rounds, growing each time round the loop
        if src == 0:
            for holder in sorted(has_value):
                peer = holder + len(has_value)
                if peer < n and r == holder:
                    dist.send(x, peer)
                elif peer < n and r == peer:
                    dist.recv(x, holder)
            has_value |= {h + len(has_value) for h in has_value if h + len(has_value) < n}
    return x


dist.init_process_group("gloo")
value = torch.full((4,), float(dist.get_rank()))
tree_broadcast(value, src=dist.get_world_size() - 1)
dist.destroy_process_group()
