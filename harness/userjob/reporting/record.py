"""From what the ranks of a user's code left (their ends and call traces) to the report:
one path for ``distdoctor run``, ``analyze`` and the pytest plugin, so each names a cause
the same way."""

from __future__ import annotations

from distdoctor.models import RankEnd, RankRecord, RunRecord, RunSpec
from distdoctor.models.strategies import USER_SCRIPT
from distdoctor.trace.evidence import evidence_from_events
from distdoctor.userjob.reporting.report import ScriptReport, report


def script_record(ends: tuple[RankEnd, ...], traces, wall_s: float, started: float,
                  deadline: float) -> RunRecord:
    """A RunRecord of user code: each rank's end and the evidence its trace holds."""
    world = len(ends)
    spec = RunSpec(strategy=USER_SCRIPT, world_size=world, num_samples=max(64, 8 * world),
                   deadline=deadline or 60.0)
    ranks = tuple(RankRecord(end.rank, end, evidence_from_events(end.rank, (), trace))
                  for end, trace in zip(ends, traces))
    return RunRecord(spec=spec, ranks=ranks, wall_s=wall_s, started=started)


def explain(record: RunRecord, script: str, all_frames: bool = False) -> ScriptReport:
    """Every detector on the record, folded into the causes a user is told."""
    from distdoctor import checks

    return report(record, checks.run_all(record), script, all_frames)
