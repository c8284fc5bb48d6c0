"""Distributed checkpointing: DDP's state saved with ``torch.distributed.checkpoint`` into
a temporary folder rank 0 chooses, trained further, loaded back, and compared."""

import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from _digest import data, digest
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
folder = [tempfile.mkdtemp(prefix="dcp-") if rank == 0 else None]
dist.broadcast_object_list(folder, src=0)
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def train(steps: int) -> None:
    for x, y in data(rank, steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


train(2)
saved = {k: v.clone() for k, v in model.state_dict().items()}
dcp.save({"model": model.state_dict()}, checkpoint_id=folder[0])
train(2)
state = {"model": model.state_dict()}
dcp.load(state, checkpoint_id=folder[0])
model.load_state_dict(state["model"])
assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
digest("dcp", model.parameters())
dist.barrier()
if rank == 0:
    shutil.rmtree(folder[0])
dist.destroy_process_group()
