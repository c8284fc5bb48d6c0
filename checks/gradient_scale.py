"""Is the synchronised gradient the mean of the ranks' local gradients?

Measured per step as the projection of the applied gradient onto the mean of the local
ones: 1.00 when averaged, N when summed at world size N. Steps where the ranks did not
apply one common gradient are skipped: the scale is undefined there (another check
reports them).
"""

from __future__ import annotations

import statistics

from checks import finding, steps_on_every_rank
from harness.models import Finding, RunRecord

NAME = "gradient_scale"
TOLERANCE = 0.05


def check(record: RunRecord) -> list[Finding]:
    world_size = len(record.ranks)
    if world_size < 2:
        return []
    ratios = [r for r in map(_ratio, steps_on_every_rank(record)) if r is not None]
    if not ratios:
        return []
    ratio = statistics.median(ratios)
    if abs(ratio - 1.0) <= TOLERANCE:
        return []
    summed = abs(ratio - world_size) <= TOLERANCE * world_size
    return [finding(
        "sum-without-mean", NAME, f"gradient {ratio:.2f}x the mean",
        f"the synchronised gradient is {ratio:.2f}x the mean of the ranks' local gradients "
        f"(1.00 when averaged) at world size {world_size}"
        + (", i.e. summed and not divided" if summed else "")
        + f": the effective learning rate is {ratio:.2f}x the one set",
        {"knobs.average_gradients": True}, range(world_size),
        {"ratio": ratio, "world_size": world_size, "ratio_per_step": ratios})]


def _ratio(steps) -> float | None:
    if any(s.grad_local is None or s.grad_synced is None or s.allreduce_calls == 0
           for s in steps):
        return None
    if len({s.grad_synced.digest for s in steps}) != 1:
        return None
    mean = [sum(column) / len(steps) for column in zip(*(s.grad_local.values for s in steps))]
    norm = sum(m * m for m in mean)
    if norm == 0.0:
        return None
    return sum(g * m for g, m in zip(steps[0].grad_synced.values, mean)) / norm
