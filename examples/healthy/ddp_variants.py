"""DDP with each of its options that a correct program may use: ``clip`` (gradient
clipping), ``autocast`` (bf16 on CPU), ``checkpoint`` (activation checkpointing inside the
model, as torch's docs place it),
``static-graph``, ``bucket-view`` (gradient_as_bucket_view), ``comm-hook`` (the
all-reduce hook), ``find-unused`` (find_unused_parameters=True, not needed here)."""

import sys

import torch
import torch.distributed as dist
from _common import batches, model
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint


class Checkpointed(torch.nn.Module):
    """A block whose activations are recomputed in backward instead of kept."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return checkpoint(self.inner, x, use_reentrant=False)


variant = sys.argv[1]
dist.init_process_group("gloo")
net = model()
if variant == "checkpoint":
    net = torch.nn.Sequential(Checkpointed(net[:2]), net[2])
options = {"static-graph": {"static_graph": True},
           "bucket-view": {"gradient_as_bucket_view": True},
           "find-unused": {"find_unused_parameters": True}}.get(variant, {})
ddp = DistributedDataParallel(net, **options)
if variant == "comm-hook":
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    ddp.register_comm_hook(None, allreduce_hook)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
for x, y in batches():
    optimizer.zero_grad()
    if variant == "autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = ddp(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
    else:
        loss = torch.nn.functional.mse_loss(ddp(x), y)
    loss.backward()
    if variant == "clip":
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), max_norm=0.1)
    optimizer.step()
dist.destroy_process_group()
