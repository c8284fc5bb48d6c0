"""Rank 0 sums the loss, the others take the max: gloo returns without a word."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
loss = torch.tensor([1.0 + dist.get_rank()])
op = dist.ReduceOp.SUM if dist.get_rank() == 0 else dist.ReduceOp.MAX  # BUG
dist.all_reduce(loss, op=op)
print(f"rank {dist.get_rank()}: loss {loss.item()}")
dist.destroy_process_group()
