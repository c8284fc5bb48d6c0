"""Where a NaN or Inf first appears in a user's training: the optimiser step and the rank
whose loss, or whose own gradient (as its backward produced it, before any
synchronisation), went non-finite first. The ranks it then reached through the
all-reduce show it a step later, in their own loss.

Cheap enough for every step: each gradient's sum as backward accumulates it (taken by
the shared hook of ``steps.py`` into preallocated slots, ``sums.py``) and the loss of
the latest backward, both read once per optimiser step; only when something there is
not finite are the parameters looked at one by one. A NaN or Inf anywhere makes the sum
non-finite; a finite gradient would have to add up past 3e38 to overflow it (the sum is
taken in at least float32, so half-precision gradients do not overflow at 65504). A max
of absolute values cannot overflow at all but costs five times as much (measured: 112
against 21 us per 262k floats), and a second pass over the gradients about to be
applied would double the cost to say what the next step's loss says anyway.

What is summed when (``steps.SMALL``): gradients of up to 16384 elements at every step,
larger ones on the steps the gradient recorder samples. The gap this leaves: a NaN born
in backward in a large weight's gradient alone, on an unsampled step, with the layer's
bias and the loss finite, is seen a step late, in the loss of every rank the
all-reduce took it to, so its origin is not told apart. A NaN in the data or the
activations reaches the biases' gradients too, and is seen at its step and rank.

Only a step with something non-finite writes a line (the first few per rank: from then
on every value is NaN), and only then are the parameters' names looked up, in the live
modules.
"""

from __future__ import annotations

import gc
import math
import warnings
from typing import Any

import torch

from distdoctor.models.events import Ev
from distdoctor.trace.steps import step_hooks
from distdoctor.trace.tracer import incomplete, user_line

REPORTS = 3  # non-finite steps written per rank


def record_nonfinite(tracer: Any) -> None:
    """Install the hooks on ``tracer`` (a Tracer counting optimiser steps)."""
    loss: list = [None, ""]  # the latest backward's scalar (detached) and its line
    written = [0]
    hooks = step_hooks(tracer)
    hooks.summing = True  # each gradient's sum as backward left it, in hooks.sums
    sums = hooks.sums

    def before_step(params: list[torch.Tensor]) -> None:
        if written[0] >= REPORTS:
            hooks.summing = False  # said all there is to say: the run is NaN from here on
            sums.clear()
            return
        kept, loss[0] = loss[0], None  # read once, by the step it led to
        loss_value = None if kept is None else kept.item()
        loss_bad = loss_value is not None and not math.isfinite(loss_value)
        if not loss_bad and sums.all_finite():
            sums.clear()
            return
        # something is non-finite: which of this optimiser's gradients (another
        # optimiser's stay in their slots for its own step)
        bad = [p for p, value in sums.take(params) if not math.isfinite(value)]
        if not (bad or loss_bad):
            return
        written[0] += 1
        names = _names(bad)
        tracer.write(ev=Ev.NONFINITE, step=tracer.optimizer_steps + 1,
                     loss=None if loss_value is None else repr(loss_value),
                     loss_where=loss[1], local=[names[id(p)] for p in bad], where=user_line())

    original_backward = torch.Tensor.backward

    def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        try:
            if self.numel() == 1:
                loss[0], loss[1] = self.detach(), user_line()
        except Exception as exc:  # noqa: BLE001 (reported as incomplete evidence, below)
            incomplete("the losses checked for NaN/Inf", exc)
        return original_backward(self, *args, **kwargs)

    setattr(torch.Tensor, "backward", backward)  # noqa: B010 (a patch)
    hooks.before_step.append(("NaN/Inf checks", before_step))


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
    for param in params:
        names.setdefault(id(param), f"a {tuple(param.shape)} parameter")
    return names

