"""Training strategies by name: each wraps a model for one kind of parallelism.

Names resolve lazily so the command line can list and validate them without importing
torch (a second of start-up on this machine).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

    from harness.models import RunSpec
    from harness.strategies.base import DataParallel

STRATEGIES: dict[str, str] = {
    "ddp": "harness.strategies.ddp:HandRolledDDP",
    "torch-ddp": "harness.strategies.torch_ddp:TorchDDP",
    "zero1": "harness.strategies.zero.stage12:Zero1",
    "zero2": "harness.strategies.zero.stage12:Zero2",
    "zero3": "harness.strategies.zero.stage3:Zero3",
    "torch-zero": "harness.strategies.torch_zero:TorchZero",
    "fsdp2": "harness.strategies.fsdp2:FSDP2",
    "fsdp2-grad-op": "harness.strategies.fsdp2:FSDP2GradOp",
}

DATA_PARALLEL = tuple(STRATEGIES)  # every strategy here: each rank trains on its own batch

# strategies that shard training state, by ZeRO stage; the rest replicate it (stage 0)
STAGES: dict[str, int] = {"zero1": 1, "zero2": 2, "zero3": 3, "torch-zero": 1,
                          "fsdp2-grad-op": 2, "fsdp2": 3}
SHARDED = tuple(STAGES)
# the same family's strategy for each stage: what a memory fix moves a run to
FAMILIES: tuple[dict[int, str], ...] = (
    {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"},
    {0: "torch-ddp", 1: "torch-zero", 2: "fsdp2-grad-op", 3: "fsdp2"},
)
HELP = {
    "ddp": "hand-rolled DDP (broadcast, all-reduce SUM, divide)",
    "torch-ddp": "torch.nn.parallel.DistributedDataParallel",
    "zero1": "hand-rolled ZeRO-1: optimiser state sharded",
    "zero2": "hand-rolled ZeRO-2: gradients sharded too",
    "zero3": "hand-rolled ZeRO-3: parameters sharded too, gathered layer by layer",
    "torch-zero": "torch ZeroRedundancyOptimizer with DDP (ZeRO-1)",
    "fsdp2": "torch fully_shard, reshard_after_forward=True (ZeRO-3)",
    "fsdp2-grad-op": "torch fully_shard, reshard_after_forward=False (ZeRO-2-like)",
}


def stage_of(strategy: str) -> int:
    return STAGES.get(strategy, 0)


def family_of(strategy: str) -> dict[int, str] | None:
    """The strategies of ``strategy``'s family by stage (None for pipelines)."""
    return next((f for f in FAMILIES if strategy in f.values()), None)


def wrap(model: "nn.Module", spec: "RunSpec") -> "DataParallel":
    try:
        target = STRATEGIES[spec.strategy]
    except KeyError:
        raise ValueError(f"unknown strategy {spec.strategy!r}; "
                         f"choose from {', '.join(STRATEGIES)}") from None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)(model, spec)
