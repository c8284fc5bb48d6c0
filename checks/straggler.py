"""Is there a rank every other rank waits for? Who arrives last at each group's collectives,
what that costs the others, and where the late rank's time goes.

The invariant: in a healthy job no rank holds the others up more than chance makes it.
Per step (``analysis/stragglers.py``) each member's cost is the time it alone held the
others up, arriving last. Two statistics of the member with the largest total, each with
a 95% interval from a bootstrap over the steps (seeded: the same record gives the same
verdict):

- its share of all the holding-up the group suffered, against chance (1/N for N members):
  a straggler causes far more than its share, at least halfway from chance to all of it,
  ``(1 + 1/N) / 2`` (0.75 of it with 2 ranks, 0.625 with 4). This is "arrives last far
  more often than chance", weighted by how late: a rank that stalls for a second every
  tenth step is caught as surely as one 20 ms late at every step;
- the share of every other rank's step spent waiting for it, beyond what the next-worst
  member costs them: at least ``FLOOR``, a tenth of the step, and at least ``MIN_WAIT_S``
  (5 ms) a step: below it the machine's scheduling, not the rank's work, can decide who
  comes last. Ranks sharing cores get a time slice (3 ms) in turn, and the one placed
  beside a busy process lags by a slice or so at every step: healthy runs of the built-in
  workload (steps of 4-20 ms, 4 ranks on 2 cores, a CPU hog on each) showed one rank up
  to 1.2 ms late at nearly every step, and 1.7 ms beyond the next-worst.

A straggler when both intervals lie above their limits. None when either lies below;
and none, too, when an estimate itself falls short of its limit and only its interval
reaches over (the evidence leans to no straggler: a noisy healthy run would otherwise be
called undecided every time, and users learn to ignore a tool that always hedges).
Inconclusive, said as such, when both estimates pass but an interval does not: measure
more steps. Everyone slow (a loaded machine, a CPU hog on every core) spreads the
waiting over all ranks: no one's share stands out, and the next-worst costs nearly what
the worst does. A rank slower by a few per cent costs under a tenth of a step; it is
not reported, since on a machine shared by more ranks than cores (as CI runners are)
such a difference is within what scheduling alone makes of one run (healthy runs under
a CPU hog on every core measured up to 3% here, their intervals reaching 9%), and it is
not what a user needs to act on. Not judged: fewer than ``MIN_STEPS`` steps.

Where its lateness is the machine's, the verdict says so and stays undecided: a rank whose
main thread waited for a CPU (the kernel's run-queue delay, trace/cpuwait.py, read at each
optimiser step's end and compared over the judged steps) at least ``MACHINE_SHARE`` of its
mean lateness a step longer than the others', while running on one less than
``WORK_SHARE`` of it longer, did the others' work and was runnable, not running: its cores
are taken by other work on the node. Its code is not what holds the others up, and healthy code on a
busy CI runner must not fail. (Over the whole job, all threads' seconds are mostly
start-up's: on a healthy 2-rank run with a busy loop on one core they differed by up to
6.6 ms a step of work and -31 to +45 ms of waiting between runs, where the steps' own
clock said 0.1 ms and 0.6-4.7 ms; the job's clock is used only where a rank's steps were
not read.) A rank slow in its own
compute runs that much longer (and, on a busy machine, waits for it too: so the work it
ran decides, not the wait alone).
"""

from __future__ import annotations

import bisect
import math
import random
import statistics
from collections import Counter

from distdoctor.analysis.stragglers import (
    GroupKey,
    Row,
    Step,
    costliest,
    group_steps,
    inside,
    rows,
    shares,
    step_ends,
)
from distdoctor.checks import finding
from distdoctor.models import Evidence, Finding, RankRecord, RunRecord
from distdoctor.models.calls import ranks_phrase, relative_line

NAME = "straggler"
JUDGES_TIME = True  # a busy machine can leave it undecided
FLOOR = 0.10  # the smallest share of the others' step reported
MIN_WAIT_S = 0.005  # ... and the smallest wait a step
NAMED_SHARE = 0.2  # a phase named as the cause holds this share of the largest excess
NAMED_S = 1e-4  # ... and is at least this long a step (0.1 ms)
MIN_STEPS = 12  # judged steps needed (the first, start-up, is never judged)
RESAMPLES = 1000
# Both sides of the machine rule are means over the judged steps: the CPU clocks give a
# step's mean, and a rank the machine stalls now and then (the suite beside a CPU hog on
# every core: 300 ms at a third of the steps, early at the rest, a median of -13 ms) is
# late on average, not at the median
MACHINE_SHARE = 0.5  # of its mean lateness a step, waited for a CPU beyond the others'
# (one sharing its core with a busy loop measured 1.05 of it, on its main thread) ...
WORK_SHARE = 0.25  # ... while running on one for less than this of it beyond theirs (a
# compute straggler runs its extra work: about all of its lateness)
PHASE_TEXT = {"loader": "waiting for its data loader's next batch", "forward": "its forward",
              "backward": "its backward", "optimizer": "its optimiser step"}


def check(record: RunRecord) -> list[Finding]:
    found: dict[int, Finding] = {}
    for key, steps in group_steps(record).items():
        if len(steps) < MIN_STEPS:
            continue
        judged = _judge(record, key, steps)
        if judged is None:
            continue
        rank = judged.ranks[0]
        kept = found.get(rank)
        if kept is None or judged.measured["wait_share"] > kept.measured["wait_share"]:
            found[rank] = judged
    return list(found.values())


def _interval(found: list[Row]) -> list[tuple[float, float]]:
    """95% bootstrap intervals of the three statistics (models.stragglers.shares),
    resampling steps."""
    pick = random.Random(0)
    n = len(found)
    drawn = [shares([found[pick.randrange(n)] for _ in range(n)]) for _ in range(RESAMPLES)]
    low, high = int(0.025 * RESAMPLES), int(0.975 * RESAMPLES) - 1
    intervals = []
    for i in range(3):
        values = sorted(d[i] for d in drawn)
        intervals.append((values[low], values[high]))
    return intervals


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(at least k successes in n trials of probability p)."""
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))


def _judge(record: RunRecord, key: GroupKey, steps: list[Step]) -> Finding | None:
    members = key[1]
    size = len(members)
    rank, second = costliest(steps)[:2]
    found = rows(steps, rank, second)
    wait, excess, share = shares(found)
    (wait_low, wait_high), (excess_low, excess_high), (share_low, share_high) = \
        _interval(found)
    chance = (1 + 1 / size) / 2
    limit = max(FLOOR, MIN_WAIT_S * len(steps) / sum(s.seconds for s in steps))
    if excess < limit or share < chance or excess_high < limit or share_high < chance:
        return None  # not a straggler: clearly, or more likely than not (the docstring)
    inconclusive = not (excess_low >= limit and share_low >= chance)
    lasts = sum(1 for s in steps if s.last == rank)
    late = sorted(s.lateness(rank) * 1e3 for s in steps)
    q1, median, q3 = statistics.quantiles(late, n=4)
    step_ms = statistics.median(s.seconds for s in steps) * 1e3
    group = "the default group" if key[0] is None else \
        f"process group {key[0]} ({ranks_phrase(members)})"
    places, fix, where = _where_time_goes(record, rank, members, [s.number for s in steps])
    cpu = _cpu_ms(record, rank, members, [s.number for s in steps])
    mean = statistics.fmean(late)
    machine = cpu is not None and mean > 0 and cpu[1] >= MACHINE_SHARE * mean and \
        cpu[0] < WORK_SHARE * mean
    if cpu is not None and machine:
        ran, waited, (thread, span) = cpu
        inconclusive = True
        places = (f"waiting for a CPU: {thread} waited {waited:.1f} ms a step longer than "
                  f"the others' for one (the kernel's run-queue delay, {span}) and ran "
                  f"{max(ran, 0.0):.1f} ms longer, against {mean:.1f} "
                  f"ms a step late on average: its cores run other work, so the machine, not its "
                  f"code, holds the others up")
        fix = (f"give rank {rank} cores of its own: fewer ranks than cores on the node, and "
               f"no other busy process beside them")
        where = ()
    verdict = ("the machine's, not the program's" if machine else
               f"cannot yet say whether it costs over {limit:.0%} of a step more than any "
               f"other rank ({excess_low:.0%}-{excess_high:.0%}): measure more steps"
               if inconclusive else "")
    symptom = (
        f"rank {rank} arrives last at {group}'s collectives in {lasts} of {len(steps)} "
        f"steps (chance: 1 in {size}), a median {median:.1f} ms after the others "
        f"(quartiles {q1:.1f}-{q3:.1f} ms); it causes {share:.0%} of all the waiting "
        f"(95% interval {share_low:.0%}-{share_high:.0%}) and every other rank spends "
        f"{wait:.0%} of its {step_ms:.1f} ms step waiting for it (95% interval "
        f"{max(wait_low, 0):.0%}-{wait_high:.0%}){'; ' + verdict if verdict else ''}. "
        f"Where its time goes: {places}")
    return finding(
        "straggler", check=NAME,
        headline=f"rank {rank} costs the others {wait:.0%} of each step"
        + (" (inconclusive)" if inconclusive else ""),
        symptom=symptom, fix_changes={"knobs.straggler_rank": -1}, ranks=[rank],
        measured={"straggler_rank": rank, "group": list(members), "steps_judged": len(steps),
         "last_in_steps": lasts, "chance_p_value": binomial_tail(lasts, len(steps), 1 / size),
         "wait_share": wait, "wait_share_interval": [wait_low, wait_high],
         "beyond_next_worst": excess, "beyond_next_worst_interval": [excess_low, excess_high],
         "share_of_waiting": share, "share_of_waiting_interval": [share_low, share_high],
         "late_ms_quartiles": [q1, median, q3], "step_ms": step_ms,
         "cpu_ms_beyond_others": list(cpu[:2]) if cpu is not None else None},
        fix=fix, inconclusive=inconclusive, kind="straggler", where=where)


def _cpu_ms(record: RunRecord, rank: int, members: tuple[int, ...], numbers: list[int]
            ) -> tuple[float, float, tuple[str, str]] | None:
    """How much longer a step ``rank``'s main thread ran on a CPU, and waited for one, than
    the other members' medians, over the judged steps ``numbers`` (its clock read at each
    optimiser step's end); where a member's is not read, the same over the job for all
    its threads (the first reading's start-up weighs in: less sure); None where neither
    is known for every member. The third: whose clock, and over what, in words."""
    by_rank = {r.rank: r.evidence for r in record.ranks}
    if any(m not in by_rank for m in members):
        return None
    stepped = {m: _step_cpu(by_rank[m], numbers) for m in members}
    whose = ("its main thread", "over the judged steps")
    if all(c is not None for c in stepped.values()):
        cpu = {m: c for m, c in stepped.items() if c is not None}
    else:
        whose = ("its threads", "over the whole job")
        steps = len(step_ends(by_rank[rank]))
        job = {m: by_rank[m].cpu_s for m in members}
        if steps == 0 or any(c is None for c in job.values()):
            return None
        cpu = {m: (c[0] / steps, c[1] / steps) for m, c in job.items() if c is not None}
    ran, waited = ((cpu[rank][i] - statistics.median(c[i] for m, c in cpu.items()
                                                     if m != rank)) * 1e3
                   for i in (0, 1))
    return ran, waited, whose


def _step_cpu(evidence: Evidence, numbers: list[int]) -> tuple[float, float] | None:
    """Mean seconds a judged step (``numbers``, as stragglers.Step counts them) the main
    thread ran on a CPU and waited for one, from the clock its optimiser steps' ends read;
    None unless every judged step's two ends were read."""
    clocks = [p.cpu for p in sorted(evidence.phases, key=lambda p: p.end)
              if p.kind == "optimizer"]
    spans = [(clocks[n - 2], clocks[n - 1]) for n in numbers if 2 <= n <= len(clocks)]
    if not spans or len(spans) < len(numbers):
        return None
    ran = waited = 0.0
    for before, after in spans:
        if before is None or after is None:
            return None
        ran, waited = ran + after[0] - before[0], waited + after[1] - before[1]
    return ran / len(spans), waited / len(spans)


def _where_time_goes(record: RunRecord, rank: int, members: tuple[int, ...],
                     numbers: list[int]) -> tuple[str, str, tuple[str, ...]]:
    """Where ``rank`` spends more per step than the others (phases, its own code), in
    words; the fix that follows; the lines to look at."""
    by_rank = {r.rank: r for r in record.ranks}
    spent = {m: _per_step(by_rank[m], numbers) for m in members}
    mine = spent[rank]
    if not mine:
        return (f"not recorded (no optimiser steps or phases on rank {rank}): run it under "
                f"'distdoctor run', or look with 'py-spy dump' while it trains",
                f"find what rank {rank} does between collectives that the others do not "
                f"('py-spy dump --pid' on it), and check its node for other work",
                ())
    excess = {kind: mine[kind] - statistics.median(spent[m].get(kind, 0.0) for m in members
                                                  if m != rank)
              for kind in mine}
    shown = sorted((k for k, v in excess.items() if v > 0), key=lambda k: -excess[k])
    biggest = excess[shown[0]] if shown else 0.0
    shown = [k for k in shown if excess[k] >= NAMED_SHARE * biggest and excess[k] >= NAMED_S]
    if not shown:
        return ("no phase of its step is longer than the others' (its time goes "
                "somewhere the phases do not cover)",
                f"check rank {rank}'s node for other work sharing its CPUs or device", ())
    said, where = [], []
    for kind in shown:
        amount = f"{excess[kind] * 1e3:.1f} ms a step more than the others"
        if kind == "own":
            sampled = _own_line(by_rank, rank, members, numbers)
            if sampled is not None:
                line, function, via, how_long = sampled
                where += [via, line] if via else [line]  # the loop's line: where to act
                reached = f", reached from the training loop at {relative_line(via)}" \
                    if via else ""
                said.append(f"its own code, {amount}, mostly at {relative_line(line)} in "
                            f"{function}{reached} ({how_long})")
            else:
                said.append(f"its own code outside the loader, forward, backward and "
                            f"optimiser step, {amount}")
        else:
            line = _phase_line(by_rank[rank].evidence, kind, numbers)
            where += [line] if line else []
            at = f" at {relative_line(line)}" if line else ""
            said.append(f"{PHASE_TEXT.get(kind, 'its ' + kind)}{at}, {amount}")
    return "; ".join(said), _fix(shown[0], rank, where), tuple(where)


def _per_step(rank: RankRecord, numbers: list[int]) -> dict[str, float]:
    """Mean seconds per judged step in each phase kind, and in its own code ("own": the
    step's time outside every phase and every blocking traced call)."""
    ends = step_ends(rank.evidence)
    wanted = {n for n in numbers if 2 <= n <= len(ends)}
    if not wanted:
        return {}
    spent: dict[str, float] = {}
    for phase in rank.evidence.phases:
        if phase.step + 1 in wanted:
            spent[phase.kind] = spent.get(phase.kind, 0.0) + phase.end - phase.start
    spans = sorted((p.start, p.end) for p in rank.evidence.phases)
    waited = 0.0  # in blocking traced calls outside every phase (the user's own)
    for call in rank.evidence.calls:
        if call.async_op or call.completed is None or inside(spans, call.entered):
            continue
        if bisect.bisect_left(ends, call.entered) + 1 in wanted:
            waited += call.completed - call.entered
    total = sum(ends[n - 1] - ends[n - 2] for n in wanted)
    spent["own"] = max(0.0, total - waited - sum(spent.values()))
    return {kind: seconds / len(wanted) for kind, seconds in spent.items()}


def _phase_line(evidence: Evidence, kind: str, numbers: list[int]) -> str:
    wanted = {n - 1 for n in numbers}
    lines = Counter(p.where for p in evidence.phases
                    if p.kind == kind and p.step in wanted and p.where)
    return lines.most_common(1)[0][0] if lines else ""


def _own_line(by_rank: dict[int, RankRecord], rank: int, members: tuple[int, ...],
              numbers: list[int]) -> tuple[str, str, str, str] | None:
    """Where ``rank``'s own code spent the most more than the others', by the samples
    taken in its long gaps: (file:line, function, the training loop's line that led there
    or "", how much a step)."""
    wanted = {n - 1 for n in numbers}

    def counts(m: int) -> dict[tuple[str, str, str], float]:
        found: dict[tuple[str, str, str], float] = {}
        for sample in by_rank[m].evidence.gap_samples:
            if sample.step in wanted:
                line = (sample.where, sample.function, sample.via)
                found[line] = found.get(line, 0.0) + sample.seconds
        return found

    mine = counts(rank)
    if not mine:
        return None
    others = [counts(m) for m in members if m != rank]
    extra = {line: n - statistics.median(o.get(line, 0) for o in others)
             for line, n in mine.items()}
    best = max(extra, key=lambda line: extra[line])
    if extra[best] <= 0:
        return None
    per_step = extra[best] / len(numbers) * 1e3
    return best[0], best[1], best[2], f"sampled there for about {per_step:.1f} ms a step"


def _fix(kind: str, rank: int, where: list[str]) -> str:
    at = f" at {relative_line(where[0])}" if where else ""
    if kind == "loader":
        return (f"feed rank {rank} faster: more DataLoader workers (num_workers) or a "
                f"larger prefetch_factor for the loader{at}, its shard on faster storage, "
                f"or samples of even cost across ranks")
    if kind in ("forward", "backward"):
        return (f"rank {rank} computes more per step than the others: give it the same "
                f"batch (size, sequence lengths) as every rank, and check its node for "
                f"another job sharing its CPUs or device")
    if kind == "optimizer":
        return (f"rank {rank}'s optimiser step costs more than the others': check what it "
                f"steps that they do not, and its node")
    return (f"move the work{at} off rank {rank}'s training step: do it every N steps, in "
            f"a background thread or process, or share it across the ranks")
