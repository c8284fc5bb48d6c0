"""Each rank's compute time per pipeline step, from the stage events it recorded: what the
stage-balance check judges, and what the pipeline report and bench print beside it."""

from __future__ import annotations

import statistics
from collections import defaultdict

from distdoctor.models.record import RankRecord, RunRecord


def per_step_times(record: RunRecord) -> dict[int, dict[int, float]]:
    """Each rank's compute CPU time per step, for the steps every rank completed: those
    its optimiser-step records name (the built-in pipeline) or, for a user's pipeline
    timed per micro-batch alone, each step it computed in, but for the one it was in when
    it stopped (a rank that did not finish)."""
    if any(r.evidence.pipe_steps for r in record.ranks):
        done = [{s.step for s in r.evidence.pipe_steps} for r in record.ranks]
    else:
        done = [_computed_in(r) for r in record.ranks]
    complete = set.intersection(*done) if done else set()
    times = {}
    for rank in record.ranks:
        by_step: defaultdict[int, float] = defaultdict(float)
        for event in rank.evidence.stage_events:
            if event.step in complete:
                by_step[event.step] += event.cpu
        if by_step:
            times[rank.rank] = dict(by_step)
    return times


def _computed_in(rank: RankRecord) -> set[int]:
    steps = {e.step for e in rank.evidence.stage_events}
    if steps and not rank.end.ok:
        steps.discard(max(steps))
    return steps


def per_rank_times(record: RunRecord) -> dict[int, float]:
    """Median over complete steps of each rank's compute CPU time per step."""
    return {rank: statistics.median(steps.values())
            for rank, steps in per_step_times(record).items()}
