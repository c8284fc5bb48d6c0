"""One set of optimiser hooks for every recorder that reads gradients at each step.

The gradient samples and the NaN/Inf check both need a hook on every parameter an
optimiser steps (to see each gradient as backward left it, before any hand-written
all-reduce) and a hook before each step. Installed once and shared, each parameter costs
one Python call per backward, not one per recorder, and the optimiser's parameters are
listed once per step. Inside a training step a Python call costs tens of microseconds
(measured: the backward's kernels leave the interpreter's caches cold), so the hook does
the one thing needed at every step itself, each gradient's sum for the NaN/Inf check,
and calls the recorders' callbacks only on the steps they sample; whether a step is
sampled is decided once, by its first gradient.

Which sums are taken when: a gradient of at most ``SMALL`` elements at every step, a
larger one on the sampled steps only. The small ones are the biases and norms, whose
gradient is non-finite whenever the layer's output gradient is; summing the large
weights at every step would be most of the check's cost (a sum reads every element).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

from distdoctor.trace.sums import GradSums
from distdoctor.trace.tracer import incomplete, plain_params

SMALL = 1 << 14  # gradients of at most this many elements are summed at every step
# each callback with the evidence it records, named for the report when it fails
Accumulated = tuple[str, Callable[[torch.Tensor, torch.Tensor], None]]  # (param, its grad)
BeforeStep = tuple[str, Callable[[list[torch.Tensor]], None]]  # the optimiser's parameters


class StepHooks:
    """Callbacks run as each plain parameter's gradient is accumulated (on the steps
    ``sampled`` names) and before every optimiser step; with ``summing`` on, gradients'
    sums are kept in ``sums`` (see the module's docstring for which). Evidence is
    best effort: a callback that raises is skipped, never the user's backward or step, and
    its evidence is reported incomplete from that step on (tracer.incomplete)."""

    def __init__(self, tracer: Any) -> None:
        self.accumulated: list[Accumulated] = []
        self.before_step: list[BeforeStep] = []
        self.sampled: Callable[[int], bool] = lambda step: True
        self.summing = False
        self.sums = GradSums()
        # id(param) -> (the parameter, weakly; its hook's handle)
        self.handles: dict[int, tuple[weakref.ref, Any]] = {}
        self._tracer = tracer
        self._decided = -1  # the step whose sampling is decided, and the decision
        self._sampling = True
        from torch.optim.optimizer import Optimizer, register_optimizer_step_pre_hook

        register_optimizer_step_pre_hook(self._before_step)
        original = Optimizer.__init__
        hooks = self

        def init(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            original(optimizer, *args, **kwargs)
            try:  # hooked from construction: step 1's backward is seen too
                hooks._hook(plain_params(optimizer))
            except Exception as exc:
                incomplete("gradient hooks", exc)

        setattr(Optimizer, "__init__", init)  # noqa: B010 (a patch)

    def _hook(self, params: list[torch.Tensor]) -> None:
        for p in params:
            entry = self.handles.get(id(p))
            if entry is None or entry[0]() is not p:  # new, or an id a dead one left
                self.handles[id(p)] = (weakref.ref(p),
                                       p.register_post_accumulate_grad_hook(self._accumulated))

    def _accumulated(self, p: torch.Tensor) -> None:
        grad = p.grad
        if grad is None or grad.layout != torch.strided:
            return
        step = self._tracer.optimizer_steps + 1
        if step != self._decided:
            self._decided, self._sampling = step, self.sampled(step)
        if self.summing and (self._sampling or grad.numel() <= SMALL):
            try:
                self.sums.add(p, grad)
            except Exception as exc:
                incomplete("NaN/Inf checks", exc)
        if not self._sampling or not self.accumulated:
            return
        for what, callback in self.accumulated:
            try:
                callback(p, grad)
            except Exception as exc:
                incomplete(what, exc)

    def _before_step(self, optimizer: Any, *args: Any) -> None:
        try:
            params = plain_params(optimizer)
            self._hook(params)  # an optimiser made before the hooks existed
        except Exception as exc:
            incomplete("gradient hooks", exc)
            return
        for what, callback in self.before_step:
            try:
                callback(params)
            except Exception as exc:
                incomplete(what, exc)


def step_hooks(tracer: Any) -> StepHooks:
    """The tracer's shared hooks, installed on first use (with its optimiser-step count)."""
    hooks = getattr(tracer, "_step_hooks", None)
    if hooks is None:
        tracer.count_optimizer_steps()  # before the pre-step hook: steps are numbered alike
        hooks = tracer._step_hooks = StepHooks(tracer)
    return hooks
