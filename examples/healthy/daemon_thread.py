"""A daemon thread (a heartbeat, a metrics pusher) still running when the script ends."""

import threading
import time

import torch
import torch.distributed as dist
from _common import batches, model
from torch.nn.parallel import DistributedDataParallel


def heartbeat() -> None:
    while True:
        time.sleep(0.05)


threading.Thread(target=heartbeat, name="heartbeat", daemon=True).start()
dist.init_process_group("gloo")
ddp = DistributedDataParallel(model())
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
for x, y in batches():
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    optimizer.step()
dist.destroy_process_group()
