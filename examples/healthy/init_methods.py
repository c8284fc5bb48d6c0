"""The group's rendezvous named each way people write it: ``tcp://`` with the launcher's
address (spelt ``localhost``, as tutorials do), or a ``file://`` every rank of one launch
shares, with rank and world size passed explicitly. A start-up judged from what each rank
gives init_process_group must find nothing wrong in either."""

import os
import sys
import tempfile

import torch
import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if sys.argv[1] == "tcp":
    method = f"tcp://localhost:{os.environ['MASTER_PORT']}"
else:  # one launch's ranks share its port, so a file named by it
    method = f"file://{tempfile.gettempdir()}/rendezvous-{os.environ['MASTER_PORT']}"
dist.init_process_group("gloo", init_method=method, rank=rank, world_size=world)
value = torch.full((4,), float(rank))
dist.all_reduce(value)
print(f"init-{sys.argv[1]} rank {rank}: {value[0].item():.6f}")
dist.destroy_process_group()
