"""Hand-written 2-way data parallel x 2-way tensor parallel on ``new_group`` subgroups, 4
ranks: ranks {0, 1} and {2, 3} each hold one model split in two (a weight sharded by its
output rows), ranks {0, 2} and {1, 3} hold the same shard and see different data. Each
shard's gradient is averaged over its data-parallel group; a scale replicated on every
rank is summed over the tensor-parallel group first. Shards differ on purpose; replicas
agree."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
tp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
tp, dp = tp_groups[rank // 2], dp_groups[rank % 2]
torch.manual_seed(0)
full = torch.randn(8, 4)
shard = torch.nn.Parameter(full[(rank % 2) * 4:(rank % 2) * 4 + 4].clone())
scale = torch.nn.Parameter(torch.ones(1))
optimizer = torch.optim.SGD([shard, scale], lr=0.05)
data = torch.Generator().manual_seed(rank // 2)  # one batch per model, both its shards
for _ in range(6):
    x, y = torch.randn(16, 4, generator=data), torch.randn(16, 8, generator=data)
    optimizer.zero_grad()
    mine = slice((rank % 2) * 4, (rank % 2) * 4 + 4)
    loss = ((scale * x @ shard.T - y[:, mine]) ** 2).mean()
    loss.backward()
    dist.all_reduce(scale.grad, group=tp)  # the scale's gradient from both shards
    for p in (shard, scale):
        dist.all_reduce(p.grad, group=dp)
        p.grad /= 2
    optimizer.step()
print(f"rank {rank}: shard sum {shard.sum().item():.6f}")
dist.destroy_process_group()
