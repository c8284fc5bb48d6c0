"""Training strategies by name: each wraps a model for one kind of data parallelism.

The names and what is known of each (stage, family, help) are in
``distdoctor.models.strategies``; here each name resolves, lazily, to the class that implements
it, so naming a strategy never imports torch (a second of start-up on this machine).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from distdoctor.models.strategies import DATA_PARALLEL

if TYPE_CHECKING:
    from torch import nn

    from distdoctor.models import RunSpec
    from distdoctor.training.strategies.base import DataParallel

STRATEGIES: dict[str, str] = {
    "ddp": "distdoctor.training.strategies.ddp:HandRolledDDP",
    "torch-ddp": "distdoctor.training.strategies.torch_ddp:TorchDDP",
    "zero1": "distdoctor.training.strategies.zero.stage12:Zero1",
    "zero2": "distdoctor.training.strategies.zero.stage12:Zero2",
    "zero3": "distdoctor.training.strategies.zero.stage3:Zero3",
    "torch-zero": "distdoctor.training.strategies.torch_zero:TorchZero",
    "fsdp2": "distdoctor.training.strategies.fsdp2:FSDP2",
    "fsdp2-grad-op": "distdoctor.training.strategies.fsdp2:FSDP2GradOp",
}
if tuple(STRATEGIES) != DATA_PARALLEL:  # one list of names: a new strategy is named in both
    raise ImportError(f"strategy implementations {tuple(STRATEGIES)} do not match the "
                      f"names in distdoctor.models.strategies {DATA_PARALLEL}")


def wrap(model: nn.Module, spec: RunSpec) -> DataParallel:
    try:
        target = STRATEGIES[spec.strategy]
    except KeyError:
        raise ValueError(f"unknown strategy {spec.strategy!r}; "
                         f"choose from {', '.join(STRATEGIES)}") from None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)(model, spec)
