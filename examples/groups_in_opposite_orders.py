"""Two process groups over the same two ranks, a metrics reducer and a loss reducer,
reduced in an order each rank picks (here, rank 1 reports its metrics first). Each group
has its own gloo context, so rank 0 waits in the loss group for rank 1, which waits in the
metrics group for rank 0: a cycle of waits across two groups, with both ranks and both
calls in it. The fix: one order on every rank."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
loss_group = dist.new_group([0, 1])
metrics_group = dist.new_group([0, 1])
loss, metrics = torch.ones(1), torch.ones(3)
if rank == 0:
    dist.all_reduce(loss, group=loss_group)  # BUG: the loss first here
    dist.all_reduce(metrics, group=metrics_group)
else:
    dist.all_reduce(metrics, group=metrics_group)  # BUG: the metrics first here
    dist.all_reduce(loss, group=loss_group)
dist.destroy_process_group()
