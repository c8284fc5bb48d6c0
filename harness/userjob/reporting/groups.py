"""Each process group a launched command made, from its traces to its report: one path
for ``run -- COMMAND``, the rerun ``run --fix`` verifies a patch with, and an exercise
graded from its launch script, so the three read a command's groups alike."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from distdoctor.models import RunRecord
from distdoctor.userjob.reporting.record import explain, script_record
from distdoctor.userjob.reporting.report import ScriptReport
from distdoctor.userjob.reporting.traces import Job, TraceError, load


@dataclass(frozen=True)
class GroupReport:
    """One process group's traces read and judged."""

    directory: Path
    job: Job
    record: RunRecord
    report: ScriptReport


@dataclass(frozen=True)
class UnreadableGroup:
    """A process group whose traces cannot be read: no report, and why."""

    directory: Path
    reason: str


def group_reports(directories: tuple[Path, ...], command: str, deadline: float,
                  all_frames: bool = False) -> Iterator[GroupReport | UnreadableGroup]:
    """Each group's report, in the order the groups started (a caller may stop at the
    first it cannot read): the command's ranks are timed by the launcher, not here."""
    for directory in directories:
        try:
            job = load([str(directory)])
        except (TraceError, OSError) as exc:
            yield UnreadableGroup(directory, str(exc))
            continue
        record = script_record(job.ends, job.events, 0.0, 0.0, deadline)
        yield GroupReport(directory, job, record, explain(record, command, all_frames))
