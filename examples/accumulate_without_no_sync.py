"""DDP with gradient accumulation over 4 micro-batches, every one of them synchronised.

The result is the same as with no_sync(), so nothing looks wrong: 3 of every 4 gradient
all-reduces are wasted traffic.
"""

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.Tanh(),
                                                          nn.Linear(16, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.randn(128, 8, generator=torch.Generator().manual_seed(dist.get_rank()))
for step in range(4):
    optimizer.zero_grad()
    for micro in range(4):  # BUG: the first three belong inside model.no_sync()
        batch = data[(step * 4 + micro) * 8:(step * 4 + micro + 1) * 8]
        loss = model(batch).pow(2).mean() / 4  # FORWARD
        loss.backward()
    optimizer.step()
dist.destroy_process_group()
