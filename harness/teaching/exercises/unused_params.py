"""DistributedDataParallel over a model with an auxiliary head that rank 0 trains."""

import torch
import torch.distributed as dist
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 8)
        self.aux = nn.Linear(8, 1)

    def forward(self, x, use_aux):
        h = torch.tanh(self.body(x))
        return h.pow(2).mean() + (self.aux(h).pow(2).mean() if use_aux else 0.0)


dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(Model())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(3):
    loss = model(torch.randn(4, 8), use_aux=dist.get_rank() == 0)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
