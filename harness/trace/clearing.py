"""Which ``zero_grad()`` calls cleared gradients in the middle of an optimiser step.

Why: accumulation adds each micro-batch's gradient to the last, and the step applies the
sum. A ``zero_grad()`` inside the micro-batch loop clears what the earlier micro-batches
added, so each step applies its last micro-batch alone: nothing fails, DDP still syncs
every backward, and the step is k times smaller and noisier than the script means. The
DDP forwards between two steps show the micro-batches; this shows which of them were
thrown away, whatever cleared them (an optimiser's ``zero_grad`` or a module's).

How: ``Optimizer.zero_grad`` and ``Module.zero_grad`` are wrapped on the class (torch's
method runs first, with the same arguments, and its result is returned unchanged). A
call is written down only when it cleared a gradient that the last DDP trained through
held when it began: its first trainable parameter's gradient, set before the call and
gone (None, or its first values zero) after. That is one attribute read per call when
there is nothing to clear, and a few values read when there is.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from distdoctor.models.events import Ev
from distdoctor.trace.tracer import first_trainable, incomplete, user_line

WHAT = "zero_grad() calls"
SAMPLED = 8  # the gradient's first values read: all zero after a clear that keeps them


def record_clearing(tracer: Any) -> None:
    import torch

    tracer.count_optimizer_steps()
    for cls in (torch.optim.Optimizer, torch.nn.Module):
        original = cls.__dict__["zero_grad"]
        if not getattr(original, "_distdoctor", False):
            setattr(cls, "zero_grad", _wrapped(original, tracer))  # noqa: B010 (a patch)


def _wrapped(original: Any, tracer: Any) -> Any:
    @functools.wraps(original)
    def zero_grad(owner: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            held = _held(tracer)
        except Exception as exc:  # noqa: BLE001 (reported as incomplete evidence)
            incomplete(WHAT, exc)
            held = None
        result = original(owner, *args, **kwargs)
        if held is not None:
            try:
                if not _holds(held):
                    tracer.write(ev=Ev.GRADS_CLEARED, steps=tracer.optimizer_steps,
                                 t=time.monotonic(), where=user_line())
            except Exception as exc:  # noqa: BLE001 (reported as incomplete evidence)
                incomplete(WHAT, exc)
        return result

    zero_grad._distdoctor = True  # type: ignore[attr-defined]
    return zero_grad


def _held(tracer: Any) -> Any:
    """The last trained DDP's first trainable parameter, if its gradient holds anything."""
    ddp = tracer.trained() if tracer.trained is not None else None
    if ddp is None:
        return None
    parameter = first_trainable(ddp)
    return parameter if parameter is not None and _holds(parameter) else None


def _holds(parameter: Any) -> bool:
    """Does its gradient hold anything? Values are read of a plain tensor only: a tensor
    subclass's (a DTensor's) reading may communicate, so its gradient holds while set."""
    import torch

    grad = parameter.grad
    if grad is None or type(grad) is not torch.Tensor:
        return grad is not None
    return bool(grad.detach().reshape(-1)[:SAMPLED].any())
