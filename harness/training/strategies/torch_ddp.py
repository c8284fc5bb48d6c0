"""torch.nn.parallel.DistributedDataParallel, with a comm hook that counts what it sends.

The hook is torch's default all-reduce hook (divide by the world size, all-reduce SUM)
written out, so the run can record every gradient all-reduce and its bytes, and so the
averaging knob can be flipped the way a user's own faulty hook would flip it.
"""

# No ``from __future__ import annotations`` here: DDP checks the hook's annotations at
# runtime and rejects them as strings.
from typing import Any, ContextManager

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from distdoctor.models import RunSpec
from distdoctor.training.strategies.base import Replicated, SyncLog, nbytes


class TorchDDP(Replicated):
    bucket_view = False  # gradients as views of DDP's buckets (else DDP holds a copy)

    def __init__(self, module: nn.Module, spec: RunSpec):
        self.module = module
        self.comm = SyncLog()
        self.ddp = DistributedDataParallel(
            module, find_unused_parameters=spec.knobs.find_unused_parameters,
            gradient_as_bucket_view=self.bucket_view)
        self.ddp.register_comm_hook(_HookState(self.comm, spec.knobs.average_gradients),
                                    _allreduce_hook)
        self._init_optimizer(spec)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.ddp(*args, **kwargs)

    def no_sync(self) -> ContextManager[None]:
        return self.ddp.no_sync()

    def finish_backward(self) -> None:
        pass  # DDP synchronised inside backward


class _HookState:
    def __init__(self, comm: SyncLog, average: bool):
        self.comm = comm
        self.average = average


def _allreduce_hook(state: _HookState,
                    bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    buffer = bucket.buffer()
    state.comm.add(nbytes(buffer))
    if state.average:
        buffer.div_(dist.get_world_size())
    work = dist.all_reduce(buffer, op=dist.ReduceOp.SUM, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])
