"""DDP's built-in communication hooks, one model each: the plain all-reduce hook, fp16
compression, and PowerSGD (rank-1 approximation, after two plain all-reduces). Each hook
reduces through ``get_future().then(...)`` chains of its own. (torch refuses the bf16 hook
without CUDA or XPU: "BF16 all reduce communication hook required CUDA 11+ and NCCL".)"""

import torch
import torch.distributed as dist
from _digest import data, digest
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
hooks = {
    "fp16": (None, default_hooks.fp16_compress_hook),
    "allreduce": (None, default_hooks.allreduce_hook),
    "powersgd": (powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                        start_powerSGD_iter=2), powersgd.powerSGD_hook),
}
for name, (state, hook) in hooks.items():
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
    model.register_comm_hook(state, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in data(rank, 5):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    digest(f"hook-{name}", model.parameters())
dist.destroy_process_group()
