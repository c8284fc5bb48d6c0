"""Which optimiser steps applied gradients a GradScaler unscaled, by what scale, and
which steps it skipped.

Why: mixed precision's loss scaling (``torch.amp.GradScaler``, FSDP's
``ShardedGradScaler``) makes backward accumulate the gradient of ``loss * scale``; the
scaler divides it back (``unscale_``, also called inside ``scaler.step``) before the
optimiser applies it. The gradient recorder samples the first as the rank's local
gradient and the second as the applied one, so without the scale every healthy AMP run
would read as a sync that divides by 65536. With it, the local gradient is read in the
loss's own units. And a step whose gradients overflowed is skipped (``scaler.step`` does
not call the optimiser): its forward is no micro-batch of the next step, which a count
of the forwards between two optimiser steps would take it for.

How: each scaler class's ``unscale_`` and ``step`` are wrapped (once, on the class;
torch's own method runs first, with the same arguments, and its result is returned
unchanged). An ``unscale_`` that returned notes the scaler and the step it unscaled
for; a ``step`` after which the optimiser's step count has not moved writes a
``step_skipped`` event. The scale itself is read only when a step's gradients are
sampled (``get_scale()``: one device sync on a GPU).
"""

from __future__ import annotations

import functools
import math
import time
import weakref
from typing import Any

from distdoctor.models.events import Ev
from distdoctor.trace.afterimport import after_import
from distdoctor.trace.tracer import incomplete

# the modules that define a GradScaler with an ``unscale_`` or ``step`` of its own, and
# the class (a subclass that defines neither runs the base class's, wrapped)
SCALERS = (("torch.amp.grad_scaler", "GradScaler"),
           ("torch.distributed.fsdp.sharded_grad_scaler", "ShardedGradScaler"))
WHAT = "gradient samples (loss scale)"


def record_unscaling(tracer: Any) -> Any:
    """Wrap every scaler class's ``unscale_`` and ``step`` as its module is imported;
    return the function that gives the scale a step's gradients were divided by (None:
    not unscaled)."""
    noted: dict[str, Any] = {"step": 0, "scaler": None}

    def unscaled(scaler: Any) -> None:
        noted["step"], noted["scaler"] = tracer.optimizer_steps + 1, weakref.ref(scaler)

    def skipped(before: int) -> None:
        if tracer.optimizer_steps == before:
            tracer.write(ev=Ev.STEP_SKIPPED, steps=before, t=time.monotonic())

    def wrap(module: Any, name: str) -> None:
        cls = getattr(module, name)
        for method, after in (("unscale_", unscaled), ("step", None)):
            original = cls.__dict__.get(method)
            if original is None or getattr(original, "_distdoctor", False):
                continue
            setattr(cls, method, _wrapped(original, after, skipped, tracer))

    for module, name in SCALERS:
        after_import(module, lambda m, name=name: wrap(m, name), WHAT)

    def scale_of(step: int) -> float | None:
        scaler = noted["scaler"]() if noted["scaler"] is not None else None
        if noted["step"] != step or scaler is None or not scaler.is_enabled():
            return None
        scale = float(scaler.get_scale())
        return scale if math.isfinite(scale) and scale > 0 else None

    return scale_of


def _wrapped(original: Any, after: Any, skipped: Any, tracer: Any) -> Any:
    """``original`` run as it is; then ``after(scaler)`` (unscale_), or, for ``step``,
    ``skipped`` told the optimiser steps counted before it. Evidence is best effort: a
    note that fails is reported as incomplete, never raised into the user's step."""
    @functools.wraps(original)
    def method(scaler: Any, *args: Any, **kwargs: Any) -> Any:
        before = tracer.optimizer_steps
        result = original(scaler, *args, **kwargs)
        try:
            if after is not None:
                after(scaler)
            else:
                skipped(before)
        except Exception as exc:  # noqa: BLE001 (reported as incomplete evidence)
            incomplete(WHAT, exc)
        return result

    method._distdoctor = True  # type: ignore[attr-defined]
    return method
