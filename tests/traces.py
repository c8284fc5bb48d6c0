"""Traces as a user's ranks write them, built by hand for the checks' unit tests: the
tracer's JSON events, folded into a run record as ``distdoctor analyze`` folds them."""

from __future__ import annotations

from distdoctor.models import RankEnd, RankRecord, RunRecord, RunSpec
from distdoctor.models.events import Ev
from distdoctor.trace.evidence import evidence_from_events


def record(*traces: list[dict]) -> RunRecord:
    """One finished rank per trace, in order."""
    return RunRecord(RunSpec(world_size=len(traces)), tuple(
        RankRecord(rank, RankEnd(rank, "finished"), evidence_from_events(rank, (), tuple(trace)))
        for rank, trace in enumerate(traces)), 1.0)


def forward(steps: int, t: float, where: str = "train.py:9") -> dict:
    """A synchronising DDP training forward at ``t``, after ``steps`` optimiser steps."""
    return {"ev": Ev.DDP_FORWARD, "steps": steps, "sync": True, "bytes": 64,
            "where": where, "t": t}
