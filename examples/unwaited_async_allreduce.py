"""Hand-written data parallelism that starts each gradient's all-reduce asynchronously to
overlap them, and steps without waiting for them: gloo finishes the reductions in the
background, so each rank applies whatever its gradient held at that moment, and the
replicas part with no error. The fix: ``work.wait()`` for every reduction before
``optimizer.step()``."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.Generator().manual_seed(rank)
for _ in range(6):
    x, y = torch.randn(32, 64, generator=data), torch.randn(32, 1, generator=data)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    works = []
    for p in model.parameters():
        p.grad /= dist.get_world_size()
        works.append(dist.all_reduce(p.grad, async_op=True))  # BUG: never waited
    optimizer.step()
total = sum(p.sum().item() for p in model.parameters())
print(f"rank {rank}: parameter sum {total:.6f}")
dist.destroy_process_group()
