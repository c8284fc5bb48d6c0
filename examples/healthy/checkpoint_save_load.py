"""DDP training saved with torch.distributed.checkpoint, then loaded back on every rank."""

import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from _common import model, train
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
ddp = DistributedDataParallel(model())
train(ddp)
folder = [tempfile.mkdtemp(prefix="dcp-") if dist.get_rank() == 0 else None]
dist.broadcast_object_list(folder, src=0)
dcp.save({"model": ddp.module.state_dict()}, checkpoint_id=folder[0])
restored = {"model": model().state_dict()}
dcp.load(restored, checkpoint_id=folder[0])
same = all(torch.equal(restored["model"][k], v) for k, v in ddp.module.state_dict().items())
if not same:
    sys.exit("the loaded checkpoint differs from the model")
dist.barrier()
if dist.get_rank() == 0:
    import shutil

    shutil.rmtree(folder[0])
dist.destroy_process_group()
