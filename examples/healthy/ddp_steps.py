"""DDP fed by a DataLoader and a DistributedSampler, every rank doing the same work: 64
steps of the loop the straggler examples break (no rank is waited for more than chance)."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

if __name__ == "__main__":
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 64), torch.randn(4096, 1))
    loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data))
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if dist.get_rank() == 0 and step % 16 == 0:
            print(f"step {step} loss {loss.item():.4f}")
    dist.destroy_process_group()
