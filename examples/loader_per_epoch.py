"""DDP whose DataLoader is made anew every epoch, with a DistributedSampler never told the
epoch: each new sampler starts at epoch 0, so every epoch replays the first one's order.

Nothing crashes and the loss goes down. distdoctor run names it (repeated-epoch-order),
though no loader object is iterated twice: it is the same loop over the same data.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
model = nn.parallel.DistributedDataParallel(nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(3):
    # BUG: a fresh sampler each epoch, and no sampler.set_epoch(epoch): the same shuffle
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    for x, y in loader:  # LOOP
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
dist.destroy_process_group()
