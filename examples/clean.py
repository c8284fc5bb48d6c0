"""A clean DDP training loop: distdoctor run reports it OK. Optional argument: steps."""

import sys

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.Tanh(),
                                                          nn.Linear(16, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.randn(64, 8, generator=torch.Generator().manual_seed(dist.get_rank()))
for step in range(int(sys.argv[1]) if len(sys.argv) > 1 else 20):
    batch = data[step % 8 * 8:(step % 8 + 1) * 8]
    loss = model(batch).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.barrier()
dist.destroy_process_group()
