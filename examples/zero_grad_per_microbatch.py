"""DDP accumulation with zero_grad() inside the micro-batch loop: each call clears what the
micro-batches before it accumulated, so every step applies its last micro-batch alone.

Nothing crashes, the loss goes down (more slowly and noisily), and every backward syncs as
DDP always does. distdoctor run names it (cleared-microbatches) and the line to move.
"""

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(),
                                                          nn.Linear(16, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(6):
    for micro in range(4):
        optimizer.zero_grad()  # BUG: clears the micro-batches before this one
        batch = torch.randn(8, 8)
        loss = model(batch).pow(2).mean() / 4  # FORWARD
        loss.backward()
    optimizer.step()
dist.destroy_process_group()
