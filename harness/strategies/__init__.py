"""Training strategies by name: each wraps a model for one kind of parallelism."""

from __future__ import annotations

from typing import Callable

from torch import nn

from harness.models import RunSpec
from harness.strategies.base import DataParallel
from harness.strategies.ddp import HandRolledDDP
from harness.strategies.torch_ddp import TorchDDP

STRATEGIES: dict[str, Callable[[nn.Module, RunSpec], DataParallel]] = {
    "ddp": HandRolledDDP,
    "torch-ddp": TorchDDP,
}


def wrap(model: nn.Module, spec: RunSpec) -> DataParallel:
    try:
        factory = STRATEGIES[spec.strategy]
    except KeyError:
        raise ValueError(f"unknown strategy {spec.strategy!r}; "
                         f"choose from {', '.join(STRATEGIES)}") from None
    return factory(model, spec)
