"""What the training loop needs from a data-parallel strategy, whoever implements it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ContextManager, Protocol

import torch
from torch import nn


@dataclass
class CommCounter:
    """Gradient all-reduces a strategy issued, and the bytes it handed them."""

    calls: int = 0
    bytes: int = 0

    def add(self, tensor: torch.Tensor) -> None:
        self.calls += 1
        self.bytes += tensor.numel() * tensor.element_size()

    def reset(self) -> None:
        self.calls = self.bytes = 0


class DataParallel(Protocol):
    module: nn.Module
    comm: CommCounter

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def no_sync(self) -> ContextManager[None]:
        """Backward passes inside accumulate locally and do not synchronise."""

    def finish_backward(self) -> None:
        """Called after every backward pass (the hand-rolled strategy syncs here)."""
