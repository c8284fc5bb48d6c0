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

Which gradients are seen when. On a sampled step (``gradients.sampled``), every one:
the recorders' samples, and each gradient's sum for the NaN/Inf check. Between sampled
steps, one per backward: the small gradient (at most ``SMALL`` elements: a bias or a
norm's) that backward reached last at the last sampled step, learned there. Backward runs
from the loss towards the inputs, so a NaN or Inf born anywhere on its way reaches the
first layers' gradients, and their small one is summed at every step, on the rank it was
born on, before any synchronisation. Every other parameter is unhooked between sampled
steps: a hook costs a Python call per parameter and backward, 8 to 15 us each inside a
backward here (the backward's kernels leave the interpreter's caches cold), and summing
every small gradient at every step was half the evidence's cost on a 1M-parameter DDP
step. The gap this leaves: a NaN born in backward on a branch that never reaches the
first layers, on an unsampled step, shows a step later, in the loss of every rank.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

from distdoctor.trace.sums import GradSums
from distdoctor.trace.tracer import incomplete, plain_params

# which backward is running (torch 2.1 and later; before, every backward counts as one)
_graph_task: Callable[[], int] = getattr(torch._C, "_current_graph_task_id", lambda: 0)
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
        # id(param) -> (the parameter, weakly; its hook's handle, None while unhooked)
        self.handles: dict[int, tuple[weakref.ref, Any]] = {}
        self.large: set[int] = set()  # ids of the handles' parameters over SMALL elements
        self.all_hooked = True  # every parameter hooked now: for a sampled step
        # the parameters hooked between sampled steps: per backward of the last sampled
        # step, the small one it reached last (None until a sampled step is seen: all small)
        self.between: set[int] | None = None
        self._last_small: dict[int, int] = {}  # graph task -> its last small parameter
        self._tracer = tracer
        self._decided = -1  # the step whose sampling is decided, and the decision
        self._sampling = True
        from torch.optim.optimizer import (
            Optimizer,
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        register_optimizer_step_pre_hook(self._before_step)
        register_optimizer_step_post_hook(self._after_step)
        original = Optimizer.__init__
        hooks = self

        def init(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            original(optimizer, *args, **kwargs)
            try:  # hooked from construction: step 1's backward is seen too
                hooks._hook(plain_params(optimizer))
            except Exception as exc:  # noqa: BLE001 (reported as incomplete evidence, below)
                incomplete("gradient hooks", exc)

        setattr(Optimizer, "__init__", init)  # noqa: B010 (a patch)

    def _hook(self, params: list[torch.Tensor]) -> None:
        for p in params:
            entry = self.handles.get(id(p))
            if entry is None or entry[0]() is not p:  # new, or an id a dead one left
                (self.large.add if p.numel() > SMALL else self.large.discard)(id(p))
                self.handles[id(p)] = (weakref.ref(p), p.register_post_accumulate_grad_hook(
                    self._accumulated) if self._wanted(id(p)) else None)

    def _wanted(self, key: int) -> bool:
        return self.all_hooked or (key not in self.large and (
            self.between is None or key in self.between))

    def hook_all(self, on: bool) -> None:
        """Hook every parameter (for a sampled step), or only those watched between."""
        if on and self.all_hooked:
            return
        self.all_hooked = on
        for key, (ref, handle) in list(self.handles.items()):
            p = ref()
            if p is None:
                self.large.discard(key)
                del self.handles[key]
            elif self._wanted(key) and handle is None:
                self.handles[key] = (ref, p.register_post_accumulate_grad_hook(
                    self._accumulated))
            elif not self._wanted(key) and handle is not None:
                handle.remove()
                self.handles[key] = (ref, None)

    def _after_step(self, *_: Any) -> None:
        """Ready the hooks for the next step (the step counter's post-step hook ran
        first: ``optimizer_steps`` counts the step just taken); after a sampled step,
        learn which small gradients each backward reached last."""
        try:
            if self._last_small:
                self.between = set(self._last_small.values())
                self._last_small.clear()
            self.hook_all(self.sampled(self._tracer.optimizer_steps + 1))
        except Exception as exc:  # noqa: BLE001 (reported as incomplete evidence, below)
            incomplete("gradient hooks", exc)

    def _accumulated(self, p: torch.Tensor) -> None:
        grad = p.grad
        if grad is None or grad.layout != torch.strided:
            return
        step = self._tracer.optimizer_steps + 1
        if step != self._decided:
            self._decided, self._sampling = step, self.sampled(step)
        if self._sampling and id(p) not in self.large:
            self._last_small[_graph_task()] = id(p)
        if self.summing and (self._sampling or grad.numel() <= SMALL):
            try:
                self.sums.add(p, grad)
            except Exception as exc:  # noqa: BLE001 (reported as incomplete evidence, below)
                incomplete("NaN/Inf checks", exc)
        if not self._sampling or not self.accumulated:
            return
        for what, callback in self.accumulated:
            try:
                callback(p, grad)
            except Exception as exc:  # noqa: BLE001 (reported as incomplete evidence, below)
                incomplete(what, exc)

    def _before_step(self, optimizer: Any, *args: Any) -> None:
        try:
            # the optimiser's plain parameters, listed and hooked again only when its
            # groups' sizes change (add_param_group): a walk over every parameter per
            # step otherwise
            # step otherwise (kept on the optimiser: gone with it)
            shape = tuple(len(group["params"]) for group in optimizer.param_groups)
            known = getattr(optimizer, "_distdoctor_listed", None)
            if known is not None and known[0] == shape and known[2] is self:
                params = known[1]
            else:
                params = plain_params(optimizer)
                self._hook(params)  # an optimiser made before the hooks existed
                optimizer._distdoctor_listed = (shape, params, self)
        except Exception as exc:  # noqa: BLE001 (reported as incomplete evidence, below)
            incomplete("gradient hooks", exc)
            return
        for what, callback in self.before_step:
            try:
                callback(params)
            except Exception as exc:  # noqa: BLE001 (reported as incomplete evidence, below)
                incomplete(what, exc)


def step_hooks(tracer: Any) -> StepHooks:
    """The tracer's shared hooks, installed on first use (with its optimiser-step count)."""
    hooks = getattr(tracer, "_step_hooks", None)
    if hooks is None:
        tracer.count_optimizer_steps()  # before the pre-step hook: steps are numbered alike
        hooks = tracer._step_hooks = StepHooks(tracer)
    return hooks
