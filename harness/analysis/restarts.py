"""What a restart failed to read back, part by part, from the ranks' RestartEvidence.

A correct resume holds, right after loading, every part of the state each rank saved
(parameters, optimiser state, scheduler, RNG state, sampler): that is the state a run that
never stopped holds at that point. Where a rank's part reads back otherwise, the other
ranks' saved parts say whose it got instead, when it is one of theirs (a checkpoint that
kept one rank's copy for all).
"""

from __future__ import annotations

from dataclasses import dataclass

from distdoctor.models import RestartEvidence, RunRecord


@dataclass(frozen=True)
class LostPart:
    part: str  # as RestartEvidence names it
    step: int  # the last step before the restart
    ranks: tuple[int, ...]  # ranks whose part did not read back as they saved it
    kept: tuple[int, ...]  # ranks whose part did
    got: tuple[tuple[int, int], ...]  # (rank, the rank whose saved part it holds instead)
    restarts: tuple[tuple[int, RestartEvidence], ...]  # every rank's evidence of it


def lost_parts(record: RunRecord) -> list[LostPart]:
    """Each part some rank lost at a restart, first restart first, in the saved order."""
    by_step: dict[int, list[tuple[int, RestartEvidence]]] = {}
    for r in record.ranks:
        for restart in r.evidence.restarts:
            by_step.setdefault(restart.step, []).append((r.rank, restart))
    found = []
    for step, restarts in sorted(by_step.items()):
        parts = dict.fromkeys(part for _, e in restarts for part, _ in e.saved)
        for part in parts:
            saved = {rank: dict(e.saved).get(part) for rank, e in restarts}
            restored = {rank: dict(e.restored).get(part) for rank, e in restarts}
            lost = tuple(rank for rank in saved if restored[rank] != saved[rank])
            if not lost:
                continue
            got = tuple((rank, other) for rank in lost for other in saved
                        if other != rank and saved[other] == restored[rank])
            found.append(LostPart(part, step, lost,
                                  tuple(rank for rank in saved if rank not in lost),
                                  _first_per_rank(got), tuple(restarts)))
    return found


def _first_per_rank(got: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """One source per rank: where several ranks saved the same bytes, the lowest."""
    sources: dict[int, int] = {}
    for rank, other in got:
        sources.setdefault(rank, other)
    return tuple(sources.items())


def lost(record: RunRecord, part: str) -> LostPart | None:
    """The first restart at which some rank lost ``part``, if any did."""
    return next((found for found in lost_parts(record) if found.part == part), None)
