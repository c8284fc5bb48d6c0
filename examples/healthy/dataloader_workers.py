"""DDP fed by a DataLoader with worker processes and a DistributedSampler; ``persistent``
as the first argument keeps the workers alive across epochs."""

import sys

import torch
import torch.distributed as dist
from _common import model
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

if __name__ == "__main__":
    persistent = sys.argv[1:] == ["persistent"]
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=8, sampler=sampler, num_workers=2,
                        persistent_workers=persistent)
    ddp = DistributedDataParallel(model())
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            optimizer.step()
    dist.destroy_process_group()
