"""Does one pipeline rank gate every cycle? Compute time per rank against the mean.

A pipeline runs at the pace of its slowest rank. Each rank's compute per step is the CPU
time of its forwards and backwards (CPU time, so ranks sharing a core do not look slower
than they are); its FLOPs share, counted by torch, says whether the cut is to blame. The
fix cuts by measured time: FLOP counters miss softmax and transposes, which attention
spends real time on.

The rule, since four ranks share two cores here and one step's times wander by +-15%:

- only steps that every rank completed are judged (a hung run's last step is partial);
- the rank with the largest median time is the candidate; its ratio to the mean of all
  ranks is taken step by step, and the 95% Student-t interval of the mean ratio is formed
  from those per-step ratios;
- unbalanced when the whole interval lies above 1.25 (the slowest rank is over 25% above
  the mean: at least a fifth of every cycle lost); balanced when it lies at or below 1.25;
  otherwise the finding is marked inconclusive, with the interval, and the runner measures
  more steps (``distdoctor.faultloop.runspec``) before anything is decided;
- unbalanced stands only when a second run, with more steps, says so too: one run's steps
  share their luck on a loaded machine (``CONFIRMED_BY_A_SECOND_RUN``);
- not judged at all: fewer than 3 complete steps, or under 2 ms of compute per rank and
  step, where per-call overhead, not compute, sets the times.
"""

from __future__ import annotations

import math
import statistics

from distdoctor.analysis.timing import per_step_times
from distdoctor.checks import finding
from distdoctor.models import Finding, RunRecord

NAME = "unbalanced_stages"
TOLERANCE = 1.25
MIN_COMPUTE_S = 0.002  # below 2 ms of compute per rank and step, per-call overhead rules
MIN_STEPS = 3  # complete steps needed before the spread across steps means anything
# One run's steps share their neighbours on the machine: a rank beside a busy process all
# run long measures slow at every step (CPU time too stretches on a shared physical core),
# and the interval cannot see it. An alarm stands once a second run raises it too.
CONFIRMED_BY_A_SECOND_RUN = True
JUDGES_TIME = True  # a busy machine can leave it undecided
# two-sided 95% Student-t quantiles by degrees of freedom
_T95 = {1: 12.71, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131,
        16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042,
        40: 2.021, 60: 2.000, 120: 1.980}


def interval(ratios: list[float]) -> tuple[float, float, float]:
    """Mean of ``ratios`` and its 95% Student-t interval (low, mean, high)."""
    mean = statistics.fmean(ratios)
    # between tabled degrees of freedom, the next lower one's quantile: the wider interval
    t95 = _T95[max(k for k in _T95 if k <= len(ratios) - 1)]
    half = t95 * statistics.stdev(ratios) / math.sqrt(len(ratios))
    return mean - half, mean, mean + half


def check(record: RunRecord) -> list[Finding]:
    steps = per_step_times(record)
    if len(steps) < 2 or len(steps) != len(record.ranks):
        return []
    judged = sorted(set.intersection(*(set(s) for s in steps.values())))
    times = {rank: statistics.median(s[n] for n in judged) for rank, s in steps.items()}
    mean = sum(times.values()) / len(times)
    if len(judged) < MIN_STEPS or mean < MIN_COMPUTE_S:
        return []
    slowest = max(times, key=lambda rank: times[rank])
    means = {n: statistics.fmean(s[n] for s in steps.values()) for n in judged}
    # a step no rank spent CPU time on (a trace from elsewhere can say so) has no ratio
    ratios = [steps[slowest][n] / means[n] for n in judged if means[n] > 0]
    if len(ratios) < MIN_STEPS:
        return []
    low, ratio, high = interval(ratios)
    if high <= TOLERANCE:
        return []
    inconclusive = low <= TOLERANCE
    flops = {r.rank: sum(s.forward_flops + s.backward_flops for s in r.evidence.stages)
             for r in record.ranks}
    total = sum(flops.values())  # 0 where no stage's FLOPs were counted
    flops_ratio = flops[slowest] / (total / len(flops)) if total else None
    # a user's pipeline counts no FLOPs: nothing to say of them there
    flops_text = f"; it does {flops_ratio:.2f}x the mean FLOPs" if total else ""
    stages = record.ranks[slowest].evidence.stages
    held = ", ".join(f"stage {s.stage} (layers {s.first_layer}-{s.end_layer - 1}: {s.kinds})"
                     for s in stages)
    per_rank = ", ".join(f"rank {r}: {t * 1e3:.1f}" for r, t in sorted(times.items()))
    spread = f"95% interval {low:.2f}-{high:.2f} over {len(ratios)} steps"
    verdict = (f"cannot say whether it exceeds the limit {TOLERANCE} ({spread}): measure "
               f"more steps" if inconclusive else
               f"over the limit {TOLERANCE} ({spread}), and so gates every cycle")
    return [finding(
        "unbalanced-stages", check=NAME,
        headline=f"rank {slowest} at {ratio:.2f}x the mean" + (" (inconclusive)" * inconclusive),
        symptom=f"rank {slowest}, holding {held}, takes {ratio:.2f}x the mean compute time per "
        f"step, "
        f"{verdict}{flops_text}. CPU ms per step (median): "
        f"{per_rank}",
        fix_changes={"knobs.stage_split": "time"}, ranks=[slowest], kind="unbalanced-stages",
        measured={"slowest_rank": slowest, "max_over_mean_time": ratio,
         "max_over_mean_time_interval": [low, high], "steps_judged": len(ratios),
         "max_over_mean_flops": flops_ratio,
         "cpu_s_per_step": {str(r): t for r, t in times.items()},
         "flops_per_micro_batch": {str(r): f for r, f in flops.items()}},
        inconclusive=inconclusive)]
