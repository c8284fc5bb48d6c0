"""Hand-rolled data parallelism: broadcast once, then all-reduce SUM and divide.

The textbook version, written out so every step a fault can break is visible: parameters
are broadcast from rank 0 at construction, and after backward all gradients go through
one flattened all-reduce (one bucket, as torch DDP uses for a model this small).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from distdoctor.models import RunSpec
from distdoctor.training.strategies.base import (
    ManualSync,
    Replicated,
    SyncLog,
    broadcast_from_rank0,
    nbytes,
)


class HandRolledDDP(ManualSync, Replicated):
    def __init__(self, module: nn.Module, spec: RunSpec):
        self.module = module
        self.comm = SyncLog()
        self._knobs = spec.knobs
        if self._knobs.broadcast_params_at_start:
            broadcast_from_rank0(module)
        self._init_optimizer(spec)

    def finish_backward(self) -> None:
        if self.syncing:
            self.sync_gradients()

    def sync_gradients(self) -> None:
        """All-reduce every gradient in one flat buffer, then divide by the world size."""
        self.require_gradients(self._knobs.find_unused_parameters, "all-reduce")
        params = list(self.module.parameters())
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in params])
        self.comm.add(nbytes(flat))
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        if self._knobs.average_gradients:
            flat.div_(dist.get_world_size())
        offset = 0
        for p in params:
            p.grad = flat[offset: offset + p.numel()].view_as(p).clone()
            offset += p.numel()
