"""What the training loop needs from a data-parallel strategy, whoever implements it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Protocol

import torch
from torch import nn


@dataclass
class SyncLog:
    """Gradient all-reduces a strategy issued and their bytes; ``on_sync`` runs before each.

    Strategies call :meth:`add` just before handing a buffer to the collective, so the
    training loop can record evidence that must reach home before a collective hangs.
    """

    calls: int = 0
    bytes: int = 0
    on_sync: Callable[[], None] | None = None

    def add(self, tensor: torch.Tensor) -> None:
        if self.on_sync is not None:
            self.on_sync()
        self.calls += 1
        self.bytes += tensor.numel() * tensor.element_size()

    def reset(self) -> None:
        self.calls = self.bytes = 0


class DataParallel(Protocol):
    module: nn.Module
    comm: SyncLog

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def no_sync(self) -> ContextManager[None]:
        """Backward passes inside accumulate locally and do not synchronise."""

    def finish_backward(self) -> None:
        """Called after every backward pass (the hand-rolled strategy syncs here)."""
