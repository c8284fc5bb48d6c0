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
}


def wrap(model: "nn.Module", spec: "RunSpec") -> "DataParallel":
    try:
        target = STRATEGIES[spec.strategy]
    except KeyError:
        raise ValueError(f"unknown strategy {spec.strategy!r}; "
                         f"choose from {', '.join(STRATEGIES)}") from None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)(model, spec)
