"""What the training loop needs from a data-parallel strategy, whoever implements it.

A strategy owns everything that differs between DDP and the ZeRO stages: how gradients
are synchronised, who holds which part of the optimiser state, and how the step is taken.
The loop reads evidence through the same few calls whatever the strategy shards: the
full parameters and the gradient applied (gathered, where they are sharded), this rank's
own gradient before synchronisation, and the bytes of state it held.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterable, Iterator, Protocol

import torch
import torch.distributed as dist
from torch import nn

from distdoctor.trace.memory import optimizer_state, storage_bytes


@dataclass
class SyncLog:
    """Gradient synchronisations a strategy issued and their bytes; ``on_sync`` runs before
    each one announced with :meth:`add`.

    Strategies that synchronise after backward call :meth:`add` just before handing a
    buffer to the collective, so the loop can record evidence that must reach home before
    a collective hangs. Strategies that synchronise layer by layer inside backward call
    :meth:`count`: the loop's evidence would be incomplete that early.
    """

    calls: int = 0
    bytes: int = 0
    on_sync: Callable[[], None] | None = None

    def add(self, nbytes: int) -> None:
        if self.on_sync is not None:
            self.on_sync()
        self.count(nbytes)

    def count(self, nbytes: int) -> None:
        self.calls += 1
        self.bytes += nbytes

    def reset(self) -> None:
        self.calls = self.bytes = 0


class GradProbe:
    """This rank's own gradient per parameter this step, summed over micro-batches, caught
    by tensor hooks as autograd produces it (before any strategy synchronises or shards it).
    """

    def __init__(self, shapes: Iterable[tuple[str, torch.Size]]):
        self.shapes = dict(shapes)
        self.local: dict[str, torch.Tensor] = {}

    @classmethod
    def on(cls, module: nn.Module) -> GradProbe:
        probe = cls((name, p.shape) for name, p in module.named_parameters())
        for name, p in module.named_parameters():
            probe.watch(name, p)
        return probe

    def watch(self, name: str, tensor: torch.Tensor) -> None:
        tensor.register_hook(lambda grad: self.add(name, grad))

    def add(self, name: str, grad: torch.Tensor) -> None:
        held = self.local.get(name)
        self.local[name] = grad.detach().clone() if held is None else held + grad.detach()

    def reset(self) -> None:
        self.local = {}

    def missing(self) -> tuple[str, ...]:
        return tuple(n for n in self.shapes if n not in self.local)

    def gradients(self) -> list[torch.Tensor]:
        """Every parameter's local gradient in order, zeros where it got none."""
        return [self.local[n] if n in self.local else torch.zeros(shape)
                for n, shape in self.shapes.items()]


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


@dataclass(frozen=True)
class HeldBytes:
    params: int
    grads: int
    optimizer: int
    gathered: int = 0


class DataParallel(Protocol):
    module: nn.Module
    comm: SyncLog
    probe: GradProbe
    stage: int  # 0: nothing sharded; 1, 2, 3: the ZeRO stage
    gradient_bytes: int  # bytes one synchronisation of every gradient must move
    optimizer_tensors: int  # tensors this rank's optimiser steps

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def no_sync(self) -> ContextManager[None]:
        """Backward passes inside accumulate locally and do not synchronise."""

    def finish_backward(self) -> None:
        """Called after every backward pass (strategies that sync after backward do it here)."""

    def zero_grad(self) -> None: ...

    def step(self) -> None:
        """The optimiser step (for ZeRO: on this rank's shard, then parameters re-shared)."""

    def full_params(self) -> list[torch.Tensor]:
        """Every parameter in full, in the model's order (gathered where sharded)."""

    def full_grads(self) -> list[torch.Tensor]:
        """The gradient the optimiser applied, in full, in the model's order."""

    def held(self) -> HeldBytes:
        """Bytes of state this rank holds now; ``gathered`` is the peak since zero_grad."""


def broadcast_from_rank0(model: nn.Module) -> None:
    """Every rank starts from rank 0's parameters (what DDP does at construction)."""
    with torch.no_grad():
        for p in model.parameters():
            dist.broadcast(p.data, src=0)


class ManualSync:
    """For strategies that synchronise gradients themselves: the forward is the module's,
    and ``no_sync`` turns their synchronisation off for the backward passes inside."""

    module: nn.Module
    probe: GradProbe
    syncing = True

    def require_gradients(self, find_unused_parameters: bool, collective: str) -> None:
        """A parameter without a gradient this step is an error, as in torch DDP, unless
        find_unused_parameters says to reduce zeros for it. Raised before the collective,
        so the rank names the parameters instead of leaving its peers to hang."""
        missing = self.probe.missing()
        if missing and not find_unused_parameters:
            raise RuntimeError(f"rank {dist.get_rank()}: parameters {', '.join(missing)} got no "
                               f"gradient; cannot {collective} them")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        previous, self.syncing = self.syncing, False
        try:
            yield
        finally:
            self.syncing = previous


class Replicated:
    """The optimiser half of strategies where every rank holds and steps the whole model."""

    stage = 0
    module: nn.Module

    def _init_optimizer(self, spec) -> None:
        self.probe = GradProbe.on(self.module)
        params = list(self.module.parameters())
        self.optimizer = self.make_optimizer(params, spec)
        self.gradient_bytes = sum(nbytes(p) for p in params)
        self.optimizer_tensors = len(params)

    def make_optimizer(self, params: list[nn.Parameter], spec) -> torch.optim.Optimizer:
        from distdoctor.training.workload import make_optimizer

        return make_optimizer(params, spec)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> None:
        self.optimizer.step()

    def full_params(self) -> list[torch.Tensor]:
        return [p.detach() for p in self.module.parameters()]

    def full_grads(self) -> list[torch.Tensor]:
        return [p.grad if p.grad is not None else torch.zeros_like(p)
                for p in self.module.parameters()]

    def held(self) -> HeldBytes:
        params = list(self.module.parameters())
        return HeldBytes(storage_bytes(params), storage_bytes(p.grad for p in params),
                         storage_bytes(optimizer_state(self.optimizer)))
