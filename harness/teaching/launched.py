"""Grade an exercise whose bug is in how the nodes are started: the student's launch script
run as ``distdoctor run -- sh launch.sh`` runs it, the training script it starts beside it.

Its nodes are torchrun agents on this machine: they meet at a free ``PORT`` the grader
gives (attempts side by side never share a rendezvous), and find the torchrun installed
beside this Python. What the launcher's nodes do before any rank exists (a rendezvous that
never completes) is the cause where there is one; else each process group's report; and
the task is one job: a process group of all the exercise's ranks.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from distdoctor.launch.ports import free_port
from distdoctor.teaching.course import SCRIPT, Exercise
from distdoctor.teaching.runs import Run
from distdoctor.userjob.launching.command import run_command
from distdoctor.userjob.reporting.groups import UnreadableGroup, group_reports

# the cause a launch script is given where its nodes each start a job of their own: the
# task is one job of all the nodes' ranks
NOT_ONE_JOB = "not-one-job"
UNREADABLE = "traces-unreadable"  # a process group's traces that cannot be read: no grade


def launch_attempt(chosen: Exercise, launcher: Path, world_size: int, deadline: float) -> Run:
    """``launcher`` run as ``distdoctor run -- sh LAUNCHER`` runs it, in its folder (the
    exercise's training script written there where it is missing), given a free ``PORT``
    and the torchrun beside this Python: torchrun's nodes that never meet are the cause,
    else each process group's own; passed is one job of ``world_size`` ranks, all
    finished, the launcher's exit 0."""
    folder = launcher.resolve().parent
    if not (folder / SCRIPT).exists():
        (folder / SCRIPT).write_text(chosen.program_source())
    environment = {"PORT": str(free_port()), "PATH": os.pathsep.join(
        [str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    result = run_command(["sh", launcher.name], deadline, quiet=True, cwd=folder,
                         environment=environment)
    try:
        if result.unformed is not None:
            return Run(world_size, False, ((result.unformed.kind, result.unformed.summary),))
        if not result.groups:
            return Run(world_size, False, ((NOT_ONE_JOB, (
                f"no rank initialised a process group: {launcher.name} "
                f"{'was stopped' if result.code is None else f'exited with code {result.code}'}"
                )),))
        sizes, finished = list[int](), result.code == 0
        causes: list[tuple[str, str]] = []
        for group in group_reports(result.groups, str(folder / SCRIPT), deadline):
            if isinstance(group, UnreadableGroup):
                return Run(world_size, False, ((UNREADABLE, f"the traces of a process "
                                                            f"group cannot be read "
                                                            f"({group.reason})"),))
            sizes.append(len(group.job.ends))
            finished = finished and all(end.status == "finished" for end in group.job.ends)
            causes += [(c.kind, c.summary) for c in group.report.findings]
        if not causes and sizes != [world_size]:
            causes.append((NOT_ONE_JOB, (
                f"the nodes started {len(sizes)} separate jobs, process groups of "
                f"{' and '.join(map(str, sizes))} rank{'s' * (sizes != [1] * len(sizes))}, "
                f"where the task is one job of {world_size} ranks: each trained on its own")))
        return Run(world_size, finished, tuple(causes))
    finally:
        shutil.rmtree(result.root, ignore_errors=True)
