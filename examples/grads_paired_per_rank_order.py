"""Hand-written data parallelism whose gradients are all-reduced in an order each rank
picks for itself (here: a dict of layers walked in a per-rank order). The two layers'
gradients have one shape, so gloo pairs rank 0's first layer with rank 1's second: each
rank gets the mean of two different layers, nothing errors, and the replicas part. The
fix: every rank reduces the tensors in one fixed order (or one flat buffer)."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
layers = {"encoder": torch.nn.Linear(4, 4), "decoder": torch.nn.Linear(4, 4)}
params = [p for layer in layers.values() for p in layer.parameters()]
optimizer = torch.optim.SGD(params, lr=0.05)
data = torch.Generator().manual_seed(rank)
order = list(layers) if rank % 2 == 0 else list(reversed(layers))
for _ in range(4):
    x = torch.randn(8, 4, generator=data)
    optimizer.zero_grad()
    layers["decoder"](torch.tanh(layers["encoder"](x))).pow(2).mean().backward()
    for name in order:  # each rank its own order
        for p in layers[name].parameters():
            dist.all_reduce(p.grad)  # BUG: in the order above
            p.grad /= dist.get_world_size()
    optimizer.step()
print(f"rank {rank}: done")
dist.destroy_process_group()
