"""One set of optimiser hooks for every recorder that reads gradients at each step.

The gradient samples and the NaN/Inf check both need a hook on every parameter an
optimiser steps (to see each gradient as backward left it, before any hand-written
all-reduce) and a hook before each step. Installed once and shared, each parameter costs
one Python call per backward, not one per recorder, and the optimiser's parameters are
listed once per step. Inside a training step a Python call costs tens of microseconds
(measured: the backward's kernels leave the interpreter's caches cold), so the hook does
the one thing needed at every step itself, each gradient's sum for the NaN/Inf check,
and calls the recorders' callbacks only on the steps they sample.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from harness.trace.tracer import plain_params

Accumulated = Callable[[torch.Tensor, torch.Tensor], None]  # (param, its strided grad)
# the dtype each gradient's sum is taken in: its own, or float32 for narrower ones (a
# half-precision sum would overflow at 65504)
_WIDE = {torch.float32: torch.float32, torch.float64: torch.float64}
BeforeStep = Callable[[list[torch.Tensor]], None]  # the optimiser's plain parameters


class StepHooks:
    """Callbacks run as each plain parameter's gradient is accumulated (on the steps
    ``sampled`` names) and before every optimiser step; with ``summing`` on, each
    gradient's sum is kept in ``sums`` (by id of its parameter) at every step. Evidence is
    best effort: a callback that raises is skipped for that call, never the user's
    backward or step."""

    def __init__(self, tracer: Any) -> None:
        self.accumulated: list[Accumulated] = []
        self.before_step: list[BeforeStep] = []
        self.sampled: Callable[[int], bool] = lambda step: True
        self.summing = False
        self.sums: dict[int, torch.Tensor] = {}
        self._tracer = tracer
        self._hooked: set[int] = set()
        from torch.optim.optimizer import Optimizer, register_optimizer_step_pre_hook

        register_optimizer_step_pre_hook(self._before_step)
        original = Optimizer.__init__
        hooks = self

        def init(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            original(optimizer, *args, **kwargs)
            try:  # hooked from construction: step 1's backward is seen too
                hooks._hook(plain_params(optimizer))
            except Exception:
                pass

        Optimizer.__init__ = init

    def _hook(self, params: list[torch.Tensor]) -> None:
        for p in params:
            if id(p) not in self._hooked:
                self._hooked.add(id(p))
                p.register_post_accumulate_grad_hook(self._accumulated)

    def _accumulated(self, p: torch.Tensor) -> None:
        grad = p.grad
        if grad is None or grad.layout != torch.strided:
            return
        if self.summing:
            self.sums.pop(id(p), None)  # a sum that fails is no stale sum
            if grad.numel():
                self.sums[id(p)] = grad.detach().sum(dtype=_WIDE.get(grad.dtype, torch.float32))
        if not self.accumulated or not self.sampled(self._tracer.optimizer_steps + 1):
            return
        for callback in self.accumulated:
            try:
                callback(p, grad)
            except Exception:
                pass

    def _before_step(self, optimizer: Any, *args: Any) -> None:
        try:
            params = plain_params(optimizer)
            self._hook(params)  # an optimiser made before the hooks existed
        except Exception:
            return
        for callback in self.before_step:
            try:
                callback(params)
            except Exception:
                pass


def step_hooks(tracer: Any) -> StepHooks:
    """The tracer's shared hooks, installed on first use (with its optimiser-step count)."""
    hooks = getattr(tracer, "_step_hooks", None)
    if hooks is None:
        tracer.count_optimizer_steps()  # before the pre-step hook: steps are numbered alike
        hooks = tracer._step_hooks = StepHooks(tracer)
    return hooks
