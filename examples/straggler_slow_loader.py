"""One rank of four reads its samples slowly: its shard sits on a slower disk (here each
sample of rank 1's costs two milliseconds more to load). Every other rank finishes its
backward and waits in DDP's gradient all-reduce for rank 1, step after step."""

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Shard(Dataset):
    def __init__(self, size: int, slow: bool):
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, 64, generator=generator)
        self.y = torch.randn(size, 1, generator=generator)
        self.slow = slow

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if self.slow:
            time.sleep(0.002)  # BUG: this rank's storage is slow, and nothing prefetches
        return self.x[i], self.y[i]


dist.init_process_group("gloo")
torch.manual_seed(0)
data = Shard(2560, slow=dist.get_rank() == 1)
loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data))
model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in loader:
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
dist.destroy_process_group()
