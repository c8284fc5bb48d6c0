"""Does one pipeline rank gate every cycle? Compute time per rank against the mean.

A pipeline runs at the pace of its slowest rank. Each rank's compute per step is the CPU
time of its forwards and backwards (CPU time, so ranks sharing a core do not look slower
than they are), taken as the median over steps. A max/mean above 1.25 means the slowest
rank gates the others; its FLOPs share, counted by torch, says whether the cut is to blame.
The fix cuts by measured time: FLOP counters miss softmax and transposes, which attention
spends real time on. Pipelines with under 2 ms of compute per rank and step are not judged:
per-call overhead, not compute, sets their times.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from checks import finding
from harness.models import Finding, RunRecord

NAME = "stage_balance"
TOLERANCE = 1.25
MIN_COMPUTE_S = 0.002  # below 2 ms of compute per rank and step, per-call overhead rules


def per_rank_times(record: RunRecord) -> dict[int, float]:
    """Median over steps of each rank's compute CPU time per step."""
    times = {}
    for rank in record.ranks:
        by_step = defaultdict(float)
        for event in rank.evidence.stage_events:
            by_step[event.step] += event.cpu
        if by_step:
            times[rank.rank] = statistics.median(by_step.values())
    return times


def check(record: RunRecord) -> list[Finding]:
    times = per_rank_times(record)
    if len(times) < 2 or len(times) != len(record.ranks):
        return []
    mean = sum(times.values()) / len(times)
    if mean < MIN_COMPUTE_S:
        return []
    slowest = max(times, key=times.get)
    ratio = times[slowest] / mean
    if ratio <= TOLERANCE:
        return []
    flops = {r.rank: sum(s.forward_flops + s.backward_flops for s in r.evidence.stages)
             for r in record.ranks}
    flops_ratio = flops[slowest] / (sum(flops.values()) / len(flops))
    stages = [s for s in record.ranks[slowest].evidence.stages]
    held = ", ".join(f"stage {s.stage} (layers {s.first_layer}-{s.end_layer - 1}: {s.kinds})"
                     for s in stages)
    per_rank = ", ".join(f"rank {r}: {t * 1e3:.1f}" for r, t in sorted(times.items()))
    return [finding(
        "unbalanced-stages", NAME, f"rank {slowest} at {ratio:.2f}x the mean",
        f"rank {slowest}, holding {held}, takes {ratio:.2f}x the mean compute time per step "
        f"(limit {TOLERANCE}) and so gates every cycle; it does {flops_ratio:.2f}x the mean "
        f"FLOPs. CPU ms per step: {per_rank}",
        {"knobs.stage_split": "time"}, [slowest],
        {"slowest_rank": slowest, "max_over_mean_time": ratio, "max_over_mean_flops": flops_ratio,
         "cpu_s_per_step": {str(r): t for r, t in times.items()},
         "flops_per_micro_batch": {str(r): f for r, f in flops.items()}})]
