"""A group that never formed: ranks stopped inside ``init_process_group``.

Every correct program's ranks leave ``init_process_group`` together, once each rank of
the group has joined its rendezvous. Ranks stopped inside it were waiting for a group
that did not form: analysis/startup.py proves the groups that never can (a world size
other than the ranks started, one rank claimed twice, ranks at different rendezvous);
otherwise a rank of the job that never called it is named, with where it was instead.
Ranks asking for different backends are judged whatever their end: one that cannot make
its backend raises, and with nccl the call returns and the hang comes at the first
collective.
"""

from __future__ import annotations

from distdoctor.analysis.startup import (
    NeverForms,
    backends_differ,
    claimed_rank,
    expected_world,
    never_forms,
)
from distdoctor.models import CauseKind, Finding, RankRecord, RunRecord, Startup
from distdoctor.models.calls import ranks_phrase, relative_line
from distdoctor.models.record import STOPPED, user_frame

NAME = "startup"
# a family: the ways a group never forms, each its own kind
KINDS: tuple[CauseKind, ...] = ("world-size-mismatch", "duplicate-rank", "split-rendezvous",
                                "backend-mismatch", "rank-never-joined")


def check(record: RunRecord) -> list[Finding]:
    entered = {r.rank: r.evidence.startup for r in record.ranks
               if r.evidence.startup is not None}
    split = backends_differ(entered)
    if split is not None:
        return [_never_forms(split, {"backends": {r: s.backend for r, s in entered.items()},
                                     "ranks_started": len(record.ranks)})]
    smaller = _asks_for_fewer(record, entered)
    if smaller is not None:
        return [smaller]
    stopped = [r for r in record.ranks if r.end.status in STOPPED]
    waiting = {r.rank: r.evidence.startup for r in stopped
               if r.evidence.startup is not None and not r.evidence.startup.joined}
    if not waiting:
        return []
    measured = {"waiting_in_init": sorted(waiting), "ranks_started": len(record.ranks)}
    found = never_forms(waiting, len(record.ranks))
    if found is not None:
        return [_never_forms(found, measured)]
    elsewhere = [r for r in stopped if r.evidence.startup is None]
    if not elsewhere:
        return []  # every rank waits in it, and nothing recorded shows why: the deadline's
    return [_never_joined(elsewhere, sorted(waiting), measured,
                          tuple(s.where for s in waiting.values() if s.where))]


def _asks_for_fewer(record: RunRecord, entered: dict[int, Startup]) -> Finding | None:
    """A rank that asked init_process_group for a group smaller than the ranks started and
    never got out of it (it raised, or stopped there): its rank has no place in that group,
    so it fails alone while the others may form the smaller group without it. Judged only
    for a rank that never joined and did not finish: one that did is not harmed."""
    started = len(record.ranks)
    left = [r for r in record.ranks if r.rank in entered and not entered[r.rank].joined
            and not r.end.ok]
    fewer = {r.rank: (r, w) for r in left
             if (w := expected_world(entered[r.rank])) is not None and w < started}
    if not fewer:
        return None
    rank, (blamed, world) = min(fewer.items())
    startup = entered[rank]
    how = (f"world_size={world} at {relative_line(startup.where)}"
           if startup.world_size is not None else f"WORLD_SIZE={world} in its environment")
    claimed = claimed_rank(startup)
    formed = [r.rank for r in record.ranks if r.rank in entered and entered[r.rank].joined]
    error = f": it raised {blamed.end.headline}" if blamed.end.headline else ""
    return Finding(
        check=NAME, fault="world-size-mismatch",
        symptom=f"rank {rank} asks init_process_group for a group of {world} ({how}), but "
                f"{started} ranks were started: as rank {claimed} it has no place in a group "
                f"of {world}, so it never joined{error}"
                + (f"; {ranks_phrase(formed)} formed a group of {world} without it"
                   if formed else ""),
        cause="the group's size is not the number of ranks the launcher started",
        fix='take the group\'s size from the launcher: world_size=int(os.environ['
            '"WORLD_SIZE"]) (or pass neither rank nor world_size: init_process_group reads '
            'them from the environment)',
        fix_changes={}, ranks=tuple(sorted(fewer)),
        measured={"asked_for": world, "ranks_started": started, "formed": formed},
        headline=f"a group of {world}, {started} ranks started", kind="world-size-mismatch",
        where=(relative_line(startup.where),) if startup.where else ())


def _never_forms(found: NeverForms, measured: dict) -> Finding:
    return Finding(check=NAME, fault=found.kind, symptom=found.symptom,
                   cause="the group can never form: init_process_group returns on no rank "
                         "until every rank of it has joined one rendezvous with one backend",
                   fix=found.fix, fix_changes={}, ranks=found.ranks, measured=measured,
                   headline=found.headline, kind=found.kind, where=found.where)


def _never_joined(absent: list[RankRecord], waiting: list[int], measured: dict,
                  lines: tuple[str, ...]) -> Finding:
    """Ranks that wait in init_process_group for ranks of the job that never called it."""
    said, places = [], []
    for rank in absent:
        frame = user_frame(rank.end.stacks)
        if frame is not None:
            places.append(relative_line(frame.place))
        said.append(f"rank {rank.rank} " + (
            f"was running {frame.function} at {places[-1]}" if frame
            else "was in none of its own code the stacks show" if rank.end.stacks
            else "has no stacks on record"))
    return Finding(
        check=NAME, fault="rank-never-joined",
        symptom=f"{ranks_phrase(waiting)} wait{'s' * (len(waiting) == 1)} in "
                f"init_process_group for {ranks_phrase([r.rank for r in absent])}, which never "
                f"called it: {'; '.join(said)}",
        cause="a rank of the group never reached init_process_group (slow to load, or "
              "stuck, before it), so the others wait for it",
        fix="make every rank reach init_process_group: call it first, before loading data "
            "or models, and look at where the missing ranks were",
        fix_changes={}, ranks=tuple(r.rank for r in absent), measured=measured,
        headline=f"{ranks_phrase([r.rank for r in absent])} never joined the group",
        kind="rank-never-joined", where=(*places, *lines))
