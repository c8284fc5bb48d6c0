"""Each rank's compute time per pipeline step, from the stage events it recorded: what the
stage-balance check judges, and what the pipeline report and bench print beside it."""

from __future__ import annotations

import statistics
from collections import defaultdict

from distdoctor.models.record import RunRecord


def per_step_times(record: RunRecord) -> dict[int, dict[int, float]]:
    """Each rank's compute CPU time per step, for the steps every rank completed."""
    done = [{s.step for s in r.evidence.pipe_steps} for r in record.ranks]
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


def per_rank_times(record: RunRecord) -> dict[int, float]:
    """Median over complete steps of each rank's compute CPU time per step."""
    return {rank: statistics.median(steps.values())
            for rank, steps in per_step_times(record).items()}
