"""A daemon thread (a heartbeat, a metrics pusher) still running when the script ends."""

import threading
import time

import torch.distributed as dist
from _common import model, train
from torch.nn.parallel import DistributedDataParallel


def heartbeat() -> None:
    while True:
        time.sleep(0.05)


threading.Thread(target=heartbeat, name="heartbeat", daemon=True).start()
dist.init_process_group("gloo")
ddp = DistributedDataParallel(model())
train(ddp)
dist.destroy_process_group()
