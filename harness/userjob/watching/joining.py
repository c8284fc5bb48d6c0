"""Ranks of ``distdoctor run -- COMMAND`` still inside ``init_process_group``.

A process of the command becomes a traced rank only once ``init_process_group`` returns
(autohook.py): a group that can never form never returns, so its ranks write nothing to
a trace, and the command would wait out torch's 30-minute timeout. Each process writes
what it gives the call into ``joining/`` as it enters and removes it as the call returns.
This module reads those notes for the watcher: a group proven never to form (every rank
the launcher started is inside the call: analysis/startup.py), or ranks inside it past
the start-up deadline, stop the command; the notes are then written out as one process
group's traces, so the same reader and checks as every other run name the cause.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from distdoctor.analysis.startup import launcher_numbering, never_forms, startup_of
from distdoctor.models.events import Ev
from distdoctor.userjob.watching.notes import live_notes

JOINING = "joining"  # the notes' folder, under the command's trace folder
GROUP = "pg-joining"  # the process group written for the ranks stopped inside the call


@dataclass(frozen=True)
class Waiting:
    """One process inside init_process_group: its note (an Ev.INIT event, with its pid
    and host) and when it entered (the machine's monotonic clock); ``raised``: the call
    raised this error instead (the process may be gone)."""

    pid: int
    event: dict
    since: float
    raised: str | None = None


@dataclass(frozen=True)
class Hung:
    """Ranks stopped inside init_process_group: by their launcher's numbering (RANK),
    where every note has it, else in order of their pids; the group's size; the proof,
    or None when the start-up deadline decided."""

    ranks: dict[int, Waiting]
    world: int
    proof: str | None


def waiting(traces: Path, members: Callable[[], list[int]],
            ended: bool = False) -> list[Waiting]:
    """The command's processes inside init_process_group now, and those whose call raised
    (``members``: the command's processes, asked only when some note exists; the note of
    a process gone that did not raise is stale). ``ended``: the command has ended, and
    every note left is read (its launcher stopped the ranks still inside the call)."""
    found = []
    for event in live_notes(traces / JOINING, members, ended):
        since, raised = event.get("t"), event.get("raised")
        if isinstance(since, (int, float)):
            found.append(Waiting(event["pid"], event, float(since),
                                 raised if isinstance(raised, str) else None))
    return found


def judge(found: list[Waiting], now: float, limit: float) -> Hung | None:
    """Hung: proven never to form (every rank the launcher started is inside the call,
    or raised in it, and one still waits), or some rank inside it for ``limit`` seconds;
    else None (ranks may still come)."""
    inside = [w for w in found if w.raised is None]
    if not inside:
        return None
    ranks, world, numbered = _numbering(found)
    if numbered and set(ranks) == set(range(world)):
        cause = never_forms({r: startup_of(w.event) for r, w in ranks.items()}, world)
        if cause is not None:
            return Hung(ranks, world, cause.symptom)
    if now - min(w.since for w in inside) >= limit:
        return Hung(ranks, world, None)
    return None


def _numbering(found: list[Waiting]) -> tuple[dict[int, Waiting], int, bool]:
    """The launcher's numbering (RANK, WORLD_SIZE), where every note has one that fits;
    else the processes in pid order, as many as there are."""
    numbers = [launcher_numbering(startup_of(w.event)) for w in found]
    worlds = {world for _, world in numbers}
    ranks = [rank for rank, _ in numbers]
    if None not in ranks and len(worlds) == 1 and None not in worlds \
            and len(set(ranks)) == len(ranks):
        world = next(iter(worlds))
        if world is not None and all(r is not None and r < world for r in ranks):
            return {r: w for r, w in zip(ranks, found) if r is not None}, world, True
    ordered = sorted(found, key=lambda w: w.pid)
    return dict(enumerate(ordered)), len(ordered), False


def write_group(traces: Path, hung: Hung, now: float) -> Path:
    """The stopped ranks as one process group's traces (``GROUP``): each rank's start, what
    it gave init_process_group, and its stall (with the proof); a rank of the launcher's
    numbering that never entered the call, its start and stall alone."""
    directory = traces / GROUP
    directory.mkdir(exist_ok=True)
    for rank in range(hung.world):
        entered = hung.ranks.get(rank)
        start = {"ev": Ev.START, "t": entered.since if entered else now, "run": GROUP,
                 "rank": rank, "world": hung.world}
        if entered is not None:
            start.update(pid=entered.pid, host=entered.event.get("host"))
        end = {"ev": Ev.STALLED, "t": now, **({"proof": hung.proof} if hung.proof else {})} \
            if entered is None or entered.raised is None else \
            {"ev": Ev.EXIT, "t": now, "status": "raised", "error": entered.raised, "code": 1}
        lines = [start, *([entered.event] if entered else []), end]
        (directory / f"rank-{rank}.jsonl").write_text(
            "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines))
    return directory

