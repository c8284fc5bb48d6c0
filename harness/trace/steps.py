"""One set of optimiser hooks for every recorder that reads gradients at each step.

The gradient samples and the NaN/Inf check both need a hook on every parameter an
optimiser steps (to see each gradient as backward left it, before any hand-written
all-reduce) and a hook before each step. Installed once and shared, each parameter costs
one Python call per backward, not one per recorder, and the optimiser's parameters are
listed once per step.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from harness.trace.tracer import plain_params

Accumulated = Callable[[torch.Tensor, torch.Tensor], None]  # (param, its strided grad)
BeforeStep = Callable[[list[torch.Tensor]], None]  # the optimiser's plain parameters


class StepHooks:
    """Callbacks run as each plain parameter's gradient is accumulated and before every
    optimiser step. Evidence is best effort: a callback that raises is skipped for that
    call, never the user's backward or step."""

    def __init__(self) -> None:
        self.accumulated: list[Accumulated] = []
        self.before_step: list[BeforeStep] = []
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
        hooks = tracer._step_hooks = StepHooks()
    return hooks
