"""The bytes of training state a user's rank holds, against the budget it was given: the
evidence for ``over-memory-budget`` from a user's script.

A device's memory is not this machine's to measure (gloo on CPU has no limit), so the
budget is the user's: ``distdoctor run --memory-budget`` (or ``DISTDOCTOR_MEMORY_BUDGET``,
bytes) says how much training state each rank may hold, as a GPU's memory would. Only
then is anything recorded: after each of the first optimiser steps (torch's global
post-step hook), the storages the rank holds of the stepped parameters, their gradients
and the optimiser's state, each storage once, as ``MemoryEvidence`` of the built-in
workload counts them. The built-in workload's strategies count with the same ``storage_bytes``. A
parameter sharded as FSDP2's ``fully_shard`` makes it (a DTensor)
counts its local shard; a ``ZeroRedundancyOptimizer`` holds only its partition's state
(its inner optimiser's), and its inner optimiser's own step is not counted twice. The
stage is what the rank does: 0 every state whole, 1 the optimiser's state partitioned,
3 the parameters sharded too. Activations are not counted: what the budget covers is
the state the ZeRO stages shard, and what the planner can move.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Iterable

import torch

from distdoctor.models.events import Ev
from distdoctor.trace.tracer import incomplete

BUDGET_ENV = "DISTDOCTOR_MEMORY_BUDGET"  # bytes of training state each rank may hold
MEASURED_STEPS = 3  # the first steps are measured: the state is whole after the first


def budget_from_env() -> int:
    """The budget the user gave, in bytes; 0 (none) when unset or not a positive integer."""
    try:
        budget = int(os.environ.get(BUDGET_ENV, "0"))
    except ValueError:
        return 0
    return max(budget, 0)


def record_memory(tracer: Any) -> None:
    """Measure the training state after the first optimiser steps, when a budget is set."""
    budget = budget_from_env()
    if not budget:
        return
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    from distdoctor.trace.steps import step_hooks

    step_hooks(tracer)  # the step counter, installed before these hooks
    inner: weakref.WeakSet = weakref.WeakSet()  # ZeroRedundancyOptimizers' own optimisers

    def before(optimizer: Any, *_: Any) -> None:
        wrapped = getattr(optimizer, "optim", None)
        if _is_zero(optimizer) and isinstance(wrapped, torch.optim.Optimizer):
            inner.add(wrapped)  # its step runs inside this one's: counted there

    def after(optimizer: Any, *_: Any) -> None:
        step = tracer.optimizer_steps
        if optimizer in inner or not 1 <= step <= MEASURED_STEPS:
            return
        try:
            tracer.write(ev=Ev.MEMORY_HELD, step=step, budget=budget,
                         world_size=_world_size(), **held(optimizer))
        # Reported as incomplete evidence; evidence is best effort: never break the step.
        except Exception as exc:  # noqa: BLE001
            incomplete("the training state's bytes", exc)

    register_optimizer_step_pre_hook(before)
    register_optimizer_step_post_hook(after)


def held(optimizer: Any) -> dict[str, int]:
    """The bytes this rank holds of ``optimizer``'s parameters, their gradients and its
    state (each storage once), the stage that holds them so, and the sizes the planner
    reads: every parameter's elements, the largest tensor's, and how many tensors."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state_owner = optimizer.optim if _is_zero(optimizer) else optimizer
    sharded = any(_is_sharded(p) for p in params)
    stage = 3 if sharded else 1 if _is_zero(optimizer) else 0
    return {"params": storage_bytes(params), "grads": storage_bytes(p.grad for p in params),
            "optimizer": storage_bytes(optimizer_state(state_owner)), "stage": stage,
            "model_params": sum(p.numel() for p in params),
            "largest": max((p.numel() for p in params), default=0), "tensors": len(params),
            "stepped": len(state_owner.state)}


def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages behind ``tensors``: views of one buffer count once,
    with the buffer's padding; a freed storage counts 0."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        if tensor is None:
            continue
        if hasattr(tensor, "to_local"):  # a DTensor: this rank's shard
            tensor = tensor.to_local()
        storage = tensor.untyped_storage()
        seen[storage.data_ptr() or id(storage)] = storage.nbytes()
    return sum(seen.values())


def optimizer_state(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The tensors of ``optimizer``'s state (its moments, step counters), every parameter's."""
    return [value for state in optimizer.state.values() for value in state.values()
            if isinstance(value, torch.Tensor)]


def _is_zero(optimizer: Any) -> bool:
    return type(optimizer).__name__ == "ZeroRedundancyOptimizer"


def _is_sharded(p: Any) -> bool:
    placements = getattr(p, "placements", ())
    return any(getattr(placement, "is_shard", lambda: False)() for placement in placements)


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_initialized() else 1
