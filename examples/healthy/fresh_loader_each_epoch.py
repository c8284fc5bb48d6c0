"""A DataLoader made anew each epoch (as scripts that change the batch size or the
augmentation per epoch do), its DistributedSampler told the epoch, and beside it a second
loader over the same data with a seed of its own, zipped with the first (mixup's partner
batches): every epoch is a new order, and the two loaders are two."""

import torch
import torch.distributed as dist
from _common import model
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
generator = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(64, 8, generator=generator),
                     torch.randn(64, 1, generator=generator))
ddp = DistributedDataParallel(model())
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
for epoch in range(3):
    samplers = [DistributedSampler(data, shuffle=True, seed=seed) for seed in (0, 1)]
    for sampler in samplers:
        sampler.set_epoch(epoch)
    loaders = [DataLoader(data, batch_size=8, sampler=sampler) for sampler in samplers]
    for (x, y), (x2, y2) in zip(*loaders):
        mixed, target = (x + x2) / 2, (y + y2) / 2
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp(mixed), target).backward()
        optimizer.step()
dist.destroy_process_group()
