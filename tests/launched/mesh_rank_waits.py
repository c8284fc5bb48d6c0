"""A group formed through init_device_mesh (as FSDP2 and tensor-parallel scripts do),
where rank 1 is stuck before it (waiting for data that never comes): rank 0 waits
inside init_device_mesh's init_process_group, which must be recorded as a start-up."""

import os
import time

from torch.distributed.device_mesh import init_device_mesh

if int(os.environ["RANK"]) == 1:
    while True:  # STUCK
        time.sleep(0.05)
mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
