"""Is the synchronised gradient the mean of the ranks' local gradients?

Measured per step as the projection of the applied gradient onto the mean of the local
ones: 1.00 when averaged, N when summed at world size N. Steps where the ranks did not
apply one common gradient are skipped: the scale is undefined there (another check
reports them). On a user's script the tracer samples each parameter's gradient at fixed
positions, as backward left it and as the optimiser applied it, and the same projection
is taken over those samples; steps where no synchronisation changed any rank's gradient
are skipped too.

A wrong average (a sum, or a division by the wrong count) scales every step's gradient
by the same factor. A factor that changes from step to step is something else: gradient
clipping (``clip_grad_norm_`` scales by max_norm over the norm, which moves as training
does) or an adaptive scaler; those are left alone (found on healthy code: clipping read
as "0.08x the mean"). So a sum hidden under clipping is not reported here either.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter

from distdoctor.checks import finding, gradient_steps_on_every_rank, steps_on_every_rank
from distdoctor.models import Finding, RunRecord

NAME = "sum_without_mean"
TOLERANCE = 0.05


def check(record: RunRecord) -> list[Finding]:
    world_size = len(record.ranks)
    if world_size < 2:
        return []
    ratios = [r for r in map(_ratio, steps_on_every_rank(record)) if r is not None]
    where = None
    if not ratios:  # a user's script: the tracer's sampled gradients
        ratios = [r for r in map(_user_ratio, gradient_steps_on_every_rank(record))
                  if r is not None]
        where = _sync_line(record)
    if not ratios:
        return []
    ratio = statistics.median(ratios)
    if abs(ratio - 1.0) <= TOLERANCE:
        return []
    if any(abs(r / ratio - 1.0) > TOLERANCE for r in ratios):
        return []  # no one scale: clipping (its factor follows the norm), not a wrong average
    summed = abs(ratio - world_size) <= TOLERANCE * world_size
    return [finding(
        "sum-without-mean", check=NAME, headline=f"gradient {ratio:.2f}x the mean",
        symptom=f"the synchronised gradient is {ratio:.2f}x the mean of the ranks' local gradients "
        f"(1.00 when averaged) at world size {world_size}"
        + (", i.e. summed and not divided" if summed else "")
        + f": the effective learning rate is {ratio:.2f}x the one set"
        + (f" (gradients all-reduced at {where})" if where else ""),
        fix_changes={"knobs.average_gradients": True}, ranks=range(world_size),
        measured={"ratio": ratio, "world_size": world_size, "ratio_per_step": ratios,
         **({"where": where} if where else {})},
        fix=None if where is None else
        f"divide the gradients all-reduced at {where} by dist.get_world_size() (or pass "
        f"op=dist.ReduceOp.AVG where the backend has it) before optimizer.step()",
        kind="sum-without-mean", where=where)]


def _user_ratio(steps) -> float | None:
    """As ``_ratio``, on sampled gradients; None where no rank's gradient was changed by a
    synchronisation (nothing was reduced: independent ranks, or one that skipped it), or
    on a step whose gradients were not sampled."""
    if any(s.local is None or s.applied is None for s in steps):
        return None
    if len({s.applied.digest for s in steps}) != 1:
        return None
    if all(s.applied.values == s.local.values for s in steps):
        return None
    return _projection(steps[0].applied, [s.local for s in steps])


def _sync_line(record: RunRecord) -> str | None:
    """The script's line that all-reduces most often on rank 0: the gradient sync."""
    lines = Counter(c.where for c in record.ranks[0].evidence.calls
                    if c.op == "all_reduce" and c.where)
    return lines.most_common(1)[0][0] if lines else None


def _ratio(steps) -> float | None:
    if any(s.grad_local is None or s.grad_synced is None or s.allreduce_calls == 0
           for s in steps):
        return None
    if len({s.grad_synced.digest for s in steps}) != 1:
        return None
    return _projection(steps[0].grad_synced, [s.grad_local for s in steps])


def _projection(applied, locals_) -> float | None:
    """The applied gradient projected on the mean of the ranks' local ones, over its norm
    (None when that mean is zero, or a value is NaN or Inf: such a step says nothing about
    the scale, and ``non_finite`` reports it)."""
    if not all(math.isfinite(v) for g in (applied, *locals_) for v in g.values):
        return None
    mean = [sum(column) / len(locals_) for column in zip(*(g.values for g in locals_))]
    norm = sum(m * m for m in mean)
    if norm == 0.0:
        return None
    return sum(g * m for g, m in zip(applied.values, mean)) / norm
