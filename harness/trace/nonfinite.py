"""Where a NaN or Inf first appears in a user's training: the optimiser step and the rank
whose loss, or whose own gradient (as its backward produced it, before any
synchronisation), went non-finite first. The ranks it then reached through the
all-reduce show it a step later, in their own loss.

Cheap enough for every step: one sum per gradient as backward accumulates it (taken by
the shared hook of ``steps.py``), and the loss kept by reference; both are read together, once per optimiser step. A NaN or Inf
anywhere makes the sum non-finite; a finite gradient would have to add up past 3e38 to
overflow it (the sum is taken in at least float32, so half-precision gradients do not
overflow at 65504). A max of absolute values cannot overflow at all but costs five times
as much (measured: 112 against 21 us per 262k floats), and a second pass over the
gradients about to be applied would double the cost to say what the next step's loss
says anyway. Only a step with something non-finite writes a line (the first few per
rank: from then on every value is NaN), and only then are the parameters' names looked
up, in the live modules.
"""

from __future__ import annotations

import gc
import math
import warnings
from typing import Any, Iterable

import torch

from harness.models import NonFiniteEvidence
from harness.trace.steps import step_hooks
from harness.trace.tracer import user_line

REPORTS = 3  # non-finite steps written per rank


def record_nonfinite(tracer: Any) -> None:
    """Install the hooks on ``tracer`` (a Tracer counting optimiser steps)."""
    loss: list = [None, ""]  # the latest backward's scalar (detached) and its line
    written = [0]
    hooks = step_hooks(tracer)
    hooks.summing = True  # id(param) -> sum of its grad as backward left it, in hooks.sums
    local = hooks.sums

    def before_step(params: list[torch.Tensor]) -> None:
        if written[0] >= REPORTS:
            hooks.summing = False  # said all there is to say: the run is NaN from here on
            local.clear()
            return
        own = [p for p in params if id(p) in local]
        values = [local.pop(id(p)) for p in own]  # another optimiser's stay for its step
        if loss[0] is not None:
            values.append(loss[0])
        if not values:
            return
        try:  # one op for all: the sums and the loss are scalars, of a dtype or two
            flat = torch.stack(values).tolist()
        except (RuntimeError, TypeError):  # on devices of their own
            flat = [float(v) for v in values]
        bad = [p for p, v in zip(own, flat) if not math.isfinite(v)]
        loss_value = flat[len(own)] if len(flat) > len(own) else None
        if not (bad or (loss_value is not None and not math.isfinite(loss_value))):
            return
        written[0] += 1
        names = _names(bad)
        tracer.write(ev="nonfinite", step=tracer.optimizer_steps + 1,
                     loss=None if loss_value is None else repr(loss_value),
                     loss_where=loss[1], local=[names[id(p)] for p in bad], where=user_line())

    original_backward = torch.Tensor.backward

    def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        try:
            if self.numel() == 1:
                loss[0], loss[1] = self.detach().reshape(()), user_line()
        except Exception:
            pass
        return original_backward(self, *args, **kwargs)

    torch.Tensor.backward = backward
    hooks.before_step.append(before_step)




def _names(params: list[torch.Tensor]) -> dict[int, str]:
    """Each parameter's name in the outermost module holding it that is not a wrapper
    (DistributedDataParallel's names all start ``module.``), found by searching the live
    modules: done only on a step that went non-finite."""
    wanted = {id(p) for p in params}
    names: dict[int, str] = {}
    from torch.nn.parallel import DistributedDataParallel

    with warnings.catch_warnings():  # isinstance on torch's deprecated module attributes
        warnings.simplefilter("ignore")
        modules = [obj for obj in gc.get_objects() if isinstance(obj, torch.nn.Module)
                   and not isinstance(obj, DistributedDataParallel)]
    for module in modules:
        for name, p in module.named_parameters():
            if id(p) in wanted and len(name) > len(names.get(id(p), "")):
                names[id(p)] = name
    for p in params:
        names.setdefault(id(p), f"a {tuple(p.shape)} parameter")
    return names


def fold_nonfinite(events: Iterable[dict]) -> tuple[NonFiniteEvidence, ...]:
    return tuple(NonFiniteEvidence(
        step=e["step"], loss=None if e.get("loss") is None else float(e["loss"]),
        loss_where=e.get("loss_where", ""), local=tuple(e.get("local", ())),
        where=e.get("where", ""))
        for e in events if e.get("ev") == "nonfinite")
