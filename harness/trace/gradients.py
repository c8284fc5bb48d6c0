"""The gradients of a user's script, sampled at optimiser steps: the evidence for a
gradient summed and never averaged, and for replicas whose parameters part.

Hooks only, no change to the script: the shared optimiser hooks of ``steps.py`` (one
post-accumulate-grad hook per parameter an optimiser holds, one global pre-step hook).
A sample is a few values at fixed positions, read through a numpy view of the tensor
where it lives on the CPU in a numpy dtype (a third of a ``torch.take``'s cost), else
taken by torch; the parameters' own views are made once.

What it costs is Python work per parameter, and it is spent where it tells something:
at every step up to ``DENSE`` and every ``STRIDE``-th after, every parameter and its
gradient, local and applied (a sum that is never divided sums at every step alike);
between those steps, the ``WATCHED`` largest parameters alone, at every ``WATCH_EVERY``-th
step, so a replica that parts is seen at most ``WATCH_EVERY - 1`` steps after the step it
parts at (an update that differs between ranks moves the big weights too; one that
touches only a small parameter is seen at the next sampled step, at most
``STRIDE - 1`` steps late). The causes that part replicas are placed at their own step
by their own evidence (an optimiser setting changed, a micro-batch left unsynchronised).
Watched at every step, those two parameters cost 0.9% of a 1M-parameter DDP step here.
A sampled step costs about 1 ms more than another on that step (every parameter's
samples, the large gradients' sums for the NaN/Inf check, the optimiser's state, every
parameter hooked and unhooked again): at every 8th step that was half the evidence's
whole cost, so after the dense start it is every 32nd (measured: 5.2% of the step's
main-thread time at every 16th, 4.1% at every 32nd).
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import numpy as np
import torch

from distdoctor.analysis.positions import spread_positions
from distdoctor.models.events import Ev
from distdoctor.trace.lossscale import record_unscaling
from distdoctor.trace.steps import step_hooks
from distdoctor.trace.tracer import storages, user_line

DENSE = 8  # the first optimiser steps, whose gradients are all sampled
STRIDE = 32  # after them, every STRIDE-th step's (see the docstring for why)
WATCHED = 2  # parameters sampled between those steps: the largest, the same on every rank
WATCH_EVERY = 4  # ... at every WATCH_EVERY-th step
_VIEWED = (torch.float32, torch.float64, torch.float16)  # dtypes numpy reads as they are


class _Positions:
    """Where a parameter is sampled, with a numpy view of the parameter itself (kept only
    while the parameter lives, and remade when its storage moves)."""

    def __init__(self, p: torch.Tensor, per_param: int) -> None:
        flat = torch.tensor(spread_positions(p.numel(), per_param))
        self.flat = flat
        self.index = np.unravel_index(flat.numpy(), tuple(p.shape)) if p.dim() else ()
        self.param = weakref.ref(p)
        self._view: np.ndarray | None = None
        self._address = -1

    def of(self, t: torch.Tensor) -> np.ndarray:
        """The sampled values of ``t`` (the parameter's shape), as a new array."""
        if viewable(t):
            return t.detach().numpy()[self.index]
        return torch.take(t.detach(), self.flat).to(torch.float64).cpu().numpy()

    def of_param(self, p: torch.Tensor) -> np.ndarray:
        if self._address != p.data_ptr() or self._view is None:
            self._view = p.detach().numpy() if viewable(p) else None
            self._address = p.data_ptr()
            if self._view is None:
                return self.of(p)
        return self._view[self.index]


def sampled(step: int) -> bool:
    """Whether optimiser step ``step`` (1-based) samples its gradients."""
    return step <= DENSE or step % STRIDE == 0


def viewable(t: torch.Tensor) -> bool:
    return t.is_cpu and t.dtype in _VIEWED and t.is_contiguous() and not t.is_conj()


def record_gradients(tracer: Any, per_param: int = 4) -> None:
    """At every optimiser step, sample each plain parameter's gradient twice, at the
    same ``per_param`` positions: as backward accumulated it (before any hand-written
    all-reduce) and as the optimiser is about to apply it. Enough to tell an averaged
    gradient (the mean of the ranks' local ones) from a summed one, at a few tensor ops
    per parameter and step. Sharded parameters (DTensor, as FSDP2 makes them) are left
    out: their gradients are shards by design. A step whose gradients a GradScaler
    unscaled carries the scale (lossscale.py): its local samples are of the scaled loss."""
    # id(param) -> (its latest accumulated sample, the grad it came from, its view)
    local: dict[int, tuple[np.ndarray, torch.Tensor, np.ndarray | None]] = {}
    where: dict[int, _Positions] = {}  # id(param) -> its sampled positions

    def positions(p: torch.Tensor) -> _Positions:
        found = where.get(id(p))
        if found is None or found.param() is not p:  # an id reused by a new parameter
            found = where[id(p)] = _Positions(p, per_param)
        return found

    def accumulated(p: torch.Tensor, grad: torch.Tensor) -> None:  # on sampled steps only
        local.pop(id(p), None)  # a sample that fails is no stale sample
        at = positions(p)
        if viewable(grad):
            view = grad.detach().numpy()
            local[id(p)] = (view[at.index], grad, view)  # the view sees a sync in place
        else:
            local[id(p)] = (at.of(grad), grad, None)

    def applied(p: torch.Tensor, at: _Positions, grad: torch.Tensor,
                seen: torch.Tensor, view: np.ndarray | None) -> np.ndarray:
        if view is not None and grad is seen and grad.data_ptr() == view.ctypes.data:
            return view[at.index]
        return at.of(grad)

    order: dict[tuple, list[weakref.ref]] = {}  # a parameter list's, largest first

    def watched(params: list[torch.Tensor]) -> list[torch.Tensor]:
        """The ``WATCHED`` largest of ``params`` that have a gradient (ties in the
        optimiser's order: alike on every rank), ranked once per optimiser's parameter
        list, known by its length and ends."""
        key = (len(params), id(params[0]), id(params[-1])) if params else ()
        ranked = order.get(key)
        if ranked is None:
            ranked = order[key] = [weakref.ref(p) for p in  # stable: ties keep order
                                   sorted(params, key=lambda p: -p.numel())]
        held = []
        for ref in ranked:
            p = ref()
            if p is None:  # a parameter gone: the list's ids may be reused, rank anew
                del order[key]
                return watched(params)
            if p.grad is not None and p.grad.layout == torch.strided:
                held.append(p)
                if len(held) == WATCHED:
                    break
        return held

    def before_step(params: list[torch.Tensor]) -> None:
        # every optimiser's steps, in the order taken (the same on every rank of an
        # SPMD script); the post-step counter has not yet seen this one
        steps = tracer.optimizer_steps + 1
        if not sampled(steps):
            local.clear()  # nothing sampled is waiting for this step
            if steps % WATCH_EVERY:
                return
            held = watched(params)
            if held:  # formatted by hand, and the step's line left to the last sampled one's
                rows = np.concatenate([positions(p).of_param(p) for p in held]).astype("<f8")
                tracer.put(f'{{"ev":"{Ev.PARAMS}","step":{steps},"rows":"{rows.tobytes().hex()}",'
                           f'"numel":{sum(p.numel() for p in held)},"t":{time.monotonic()!r}}}')
            return
        mine, now, values, numel = [], [], [], 0
        grads, kept = [], []
        for p in params:
            entry = local.pop(id(p), None)  # a parameter backward leaves alone next step
            grad = p.grad  # keeps no stale sample
            if entry is None or grad is None or grad.layout != torch.strided:
                continue
            at = where[id(p)]
            mine.append(entry[0])
            now.append(applied(p, at, grad, entry[1], entry[2]))
            values.append(at.of_param(p))
            numel += p.numel()
            grads.append(grad)
            kept.append(p)
        if not mine:
            return  # the first step, before the hooks existed, or no gradients
        # as float64 bytes in hex: exact, and 30x cheaper to write than JSON's float reprs
        rows = np.concatenate(mine + now + values).astype("<f8")
        scale = scale_of(steps)  # the local samples are of the loss times this
        tracer.write(ev=Ev.GRADS, step=steps, rows=rows.tobytes().hex(), numel=numel,
                     where=user_line(), t=time.monotonic(), gst=storages(grads),
                     pst=storages(kept), **({"scale": scale} if scale is not None else {}))

    scale_of = record_unscaling(tracer)
    hooks = step_hooks(tracer)
    hooks.sampled = sampled
    hooks.accumulated.append(("gradient samples", accumulated))
    hooks.before_step.append(("gradient samples", before_step))

