"""torch's ZeRO-1: ZeroRedundancyOptimizer stepping this rank's share of the parameters,
with DistributedDataParallel synchronising the gradients.

ZeroRedundancyOptimizer shards whole tensors, not flat slices: it hands each parameter,
largest first, to the rank holding the fewest elements so far, then broadcasts every
parameter from its owner after the step. A model whose largest tensor is a big share of
it (as here: fc2.weight is over half) leaves the ranks' optimiser state uneven, and the
measured bytes per rank show it. DDP keeps gradients as views of its buckets, so the
gradient bytes are the buckets' and nothing is counted twice.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from distdoctor.models import RunSpec
from distdoctor.trace.memory import optimizer_state, storage_bytes
from distdoctor.training.strategies.base import HeldBytes
from distdoctor.training.strategies.torch_ddp import TorchDDP
from distdoctor.training.workload import optimizer_class


class TorchZero(TorchDDP):
    stage = 1
    bucket_view = True

    def make_optimizer(self, params: list[nn.Parameter], spec: RunSpec) -> ZeroRedundancyOptimizer:
        return ZeroRedundancyOptimizer(params, optimizer_class=optimizer_class(spec),
                                       lr=spec.learning_rate)

    def _init_optimizer(self, spec: RunSpec) -> None:
        super()._init_optimizer(spec)
        self.optimizer_tensors = len(self._mine())  # the parameters this rank steps

    def _mine(self) -> list[nn.Parameter]:
        return [p for group in self._local().param_groups for p in group["params"]]

    def _local(self) -> torch.optim.Optimizer:
        """The optimiser ZeroRedundancyOptimizer steps this rank's shard with."""
        return cast(ZeroRedundancyOptimizer, self.optimizer).optim

    def held(self) -> HeldBytes:
        params = list(self.module.parameters())
        return HeldBytes(storage_bytes(params), storage_bytes(p.grad for p in params),
                         storage_bytes(optimizer_state(self._local())))
