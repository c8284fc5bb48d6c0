"""Who the others wait for, step by step: each group's collectives with every member's
arrival, and what the last arriver cost the rest.

In a bulk-synchronous job every member of a group must arrive at a collective before any
can leave it. The rank that arrives last at collective c, by ``margin(c)`` = its arrival
minus the next-latest one's, holds every other member up by that margin: had it arrived
with the next-latest, all of them would have left that much sooner. A blocking call
(traced, no ``async_op``) re-aligns the ranks, so its margins add up over a step; the
collectives torch makes asynchronously (DDP's gradient buckets, FSDP's gathers) are
waited for together, so a step's wait there is the largest of their margins, not the sum.
That is a step's ``cost`` per rank: the time it alone held the others up.

Arrivals come from torch's Flight Recorder when every member of a group recorded it
(every collective, DDP's own included), else from the tracer's calls; times across
machines are compared in wall-clock time (each rank's ``wall_offset``), on one machine
the monotonic clock it shares. Steps are each rank's optimiser steps (the end of its
``optimizer`` phases), else each collective is a step of its own.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass

from distdoctor.models.calls import is_collective
from distdoctor.models.evidence import Evidence
from distdoctor.models.record import RunRecord

GroupKey = tuple[str | None, tuple[int, ...]]  # (name, None for the default; its ranks)
# a job shorter than this leaves no arrivals (trace/arrivals.py reads none): whatever a
# straggler costs it is little, and reading them costs a job 30 ms
MIN_JOB_S = 0.5


@dataclass(frozen=True)
class Collective:
    """One collective of a group, as every member entered it."""

    seq: int
    op: str
    arrived: dict[int, float]  # rank -> arrival, on the clock all members share
    blocking: bool  # the ranks waited in it there and then (else with others, later)

    @property
    def last(self) -> int:
        return max(self.arrived, key=lambda r: self.arrived[r])

    @property
    def margin(self) -> float:
        """How much later the last arriver came than the next-latest."""
        times = sorted(self.arrived.values())
        return times[-1] - times[-2] if len(times) > 1 else 0.0


@dataclass(frozen=True)
class Step:
    """One step of a group: its collectives, how long it took (the median over members of
    each one's own step time), and each member's cost (see the module's docstring)."""

    number: int  # the optimiser step it ends with (1-based); else the collective's place
    seconds: float
    collectives: tuple[Collective, ...]
    cost: dict[int, float]

    @property
    def last(self) -> int | None:
        """The member that held the others up longest in this step (None: nobody did)."""
        rank = max(self.cost, key=lambda m: self.cost[m])
        return rank if self.cost[rank] > 0 else None

    def lateness(self, rank: int) -> float:
        """How much later ``rank`` arrived than the others' median, at the collective of
        the step where it was latest."""
        return max((c.arrived[rank] - statistics.median(t for r, t in c.arrived.items()
                                                        if r != rank)
                    for c in self.collectives), default=0.0)


def group_steps(record: RunRecord) -> dict[GroupKey, list[Step]]:
    """Each group of two or more ranks with collectives every member recorded: its steps
    in order, the first (start-up) and any after the last optimiser step left out."""
    by_rank = {r.rank: r.evidence for r in record.ranks}
    found = {}
    for key, collectives in _collectives(by_rank).items():
        steps = _steps(key[1], collectives, by_rank)
        if steps:
            found[key] = steps
    return found


def _collectives(by_rank: dict[int, Evidence]) -> dict[GroupKey, list[Collective]]:
    # per group, per member, per number: (op, arrival, blocking: None when not known)
    Seen = dict[GroupKey, dict[int, dict[int, tuple[str, float, bool | None]]]]
    recorded: Seen = {}
    traced: Seen = {}
    spans: dict[GroupKey, dict[int, list[tuple[float, float]]]] = {}
    for rank, evidence in by_rank.items():
        for a in evidence.arrivals:
            recorded.setdefault((a.pg, a.group), {}).setdefault(rank, {})[a.seq] = \
                (a.op, a.at, None)
        for call in evidence.calls:
            if not is_collective(call.op) or len(call.group) < 2:
                continue
            key = (call.pg, call.group)
            held = not call.async_op and call.completed is not None
            traced.setdefault(key, {}).setdefault(rank, {})[call.seq] = \
                (call.op, call.entered, held)
            if held:
                spans.setdefault(key, {}).setdefault(rank, []).append(
                    (call.entered, call.completed or call.entered))
    found: dict[GroupKey, list[Collective]] = {}
    for key in set(recorded) | set(traced):
        members = key[1]
        if len(members) < 2 or not all(m in by_rank for m in members):
            continue
        source = recorded.get(key, {})
        if not all(m in source for m in members):
            source = traced.get(key, {})
            if not all(m in source for m in members):
                continue
        offsets = [by_rank[m].wall_offset for m in members]
        shift = {m: (by_rank[m].wall_offset or 0.0) if None not in offsets else 0.0
                 for m in members}
        first = members[0]
        first_spans = sorted(spans.get(key, {}).get(first, []))
        for seq in sorted(set.intersection(*(set(source[m]) for m in members))):
            op, at, traced_held = source[first][seq]
            # by the recorder: blocking when a traced blocking call held it
            held = inside(first_spans, at) if traced_held is None else traced_held
            found.setdefault(key, []).append(Collective(
                seq, op, {m: source[m][seq][1] + shift[m] for m in members}, held))
    return found


def inside(spans: list[tuple[float, float]], at: float) -> bool:
    """Is ``at`` within one of the sorted (entered, completed) spans?"""
    index = bisect.bisect_right(spans, (at, float("inf"))) - 1
    return index >= 0 and spans[index][0] <= at <= spans[index][1]


def step_ends(evidence: Evidence) -> list[float]:
    """When each of a rank's optimiser steps ended, on its monotonic clock."""
    return sorted(p.end for p in evidence.phases if p.kind == "optimizer")


def _steps(members: tuple[int, ...], collectives: list[Collective],
           by_rank: dict[int, Evidence]) -> list[Step]:
    ends = {m: step_ends(by_rank[m]) for m in members}
    count = min(len(e) for e in ends.values())
    collectives = sorted(collectives, key=lambda c: c.seq)
    if count < 2:  # no optimiser steps: each collective its own step
        found = []
        for before, c in zip(collectives, collectives[1:]):
            seconds = max(c.arrived.values()) - max(before.arrived.values())
            found.append(Step(c.seq, seconds, (c,), _cost((c,))))
        return found
    first = members[0]
    shift = (by_rank[first].wall_offset or 0.0) if all(
        by_rank[m].wall_offset is not None for m in members) else 0.0
    bounds = [t + shift for t in ends[first][:count]]
    per_step: dict[int, list[Collective]] = {}
    for c in collectives:
        number = bisect.bisect_left(bounds, c.arrived[first]) + 1  # the step it ends with
        if 2 <= number <= count:  # not start-up, not after the last step
            per_step.setdefault(number, []).append(c)
    return [Step(n, statistics.median(ends[m][n - 1] - ends[m][n - 2] for m in members),
                 tuple(held), _cost(held))
            for n, held in sorted(per_step.items())]


def _cost(collectives: tuple[Collective, ...] | list[Collective]) -> dict[int, float]:
    """Each member's cost to the others in one step (see the module's docstring)."""
    members = collectives[0].arrived
    summed = dict.fromkeys(members, 0.0)
    largest = dict.fromkeys(members, 0.0)
    for c in collectives:
        last = c.last
        if c.blocking:
            summed[last] += c.margin
        else:
            largest[last] = max(largest[last], c.margin)
    return {m: summed[m] + largest[m] for m in members}


# one step as the statistics read it: (the rank's cost, the others' mean cost, the
# next-worst member's cost, the step's seconds, everyone's cost)
Row = tuple[float, float, float, float, float]


def rows(steps: list[Step], rank: int, second: int | None = None) -> list[Row]:
    """Each step as a Row for ``rank``, against ``second`` as the next-worst member."""
    found = []
    for s in steps:
        others = [cost for member, cost in s.cost.items() if member != rank]
        found.append((s.cost[rank], statistics.fmean(others) if others else 0.0,
                      s.cost[second] if second is not None else 0.0, s.seconds,
                      sum(s.cost.values())))
    return found


def shares(found: list[Row]) -> tuple[float, float, float]:
    """Over some steps' rows: the share of the others' step spent waiting for the rank,
    the same beyond what the next-worst member costs them, and the rank's share of all the
    holding-up the group suffered."""
    mine, others, second, seconds, everyone = (sum(r[i] for r in found) for i in range(5))
    if seconds <= 0:
        return 0.0, 0.0, 0.0
    return (mine - others) / seconds, (mine - second) / seconds, \
        mine / everyone if everyone > 0 else 0.0


def costliest(steps: list[Step]) -> list[int]:
    """The group's members, the one that held the others up longest in all first."""
    totals = {m: sum(s.cost[m] for s in steps) for m in steps[0].cost}
    return sorted(totals, key=lambda m: -totals[m])


def waiting(record: RunRecord) -> str | None:
    """The waiting a run's costliest rank put on the others, in words, judged or not: the
    verification that a straggler's fix took the wait away. None without steps to judge."""
    said = []
    for steps in group_steps(record).values():
        rank = costliest(steps)[0]
        said.append(f"the costliest rank ({rank}) holds the others up "
                    f"{shares(rows(steps, rank))[0]:.0%} of a "
                    f"{statistics.median(s.seconds for s in steps) * 1e3:.1f} ms step")
    return "; ".join(said) or None
