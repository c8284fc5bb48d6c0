"""Why did the ranks stop? The wait-for graph of a hung run, and the cause it shows.

Every rank that was stopped (hung, or still running after a peer failed) is blocked in the
last call its tracer saw it enter without leaving. Each blocking call is an edge to the
ranks it waits for: a send or receive waits for its peer; a collective waits for the ranks
of its group that never entered the same collective (same group, same sequence number).
The cause, in order of precedence:

* the first number at which a group's collectives parted (analysis/sequences.py), in the
  traced calls or, torch's own collectives included, in the ranks' Flight Recorders,
  whatever the ranks are blocked in now: gloo may have paired the differing calls and let some
  ranks on, so the calls blocked at the end no longer differ, and the odd ranks out of
  that first number are to blame;
* a cycle of point-to-point calls: every rank in it waits for the next (all sending first
  is the send-before-receive deadlock; all receiving first is its mirror);
* a rank missing from a collective the others are in (and where it is instead);
* otherwise, each rank's blocking call, so a person can take it from there.
"""

from __future__ import annotations

from dataclasses import replace

from distdoctor.analysis.sequences import parting_of
from distdoctor.analysis.waitfor import (
    blocking_call,
    cycle_of,
    joined_by,
    same_collective,
    wait_edges,
    waits_for,
)
from distdoctor.checks import finding
from distdoctor.checks.collective_mismatch import parted
from distdoctor.models import Call, CauseKind, Finding, RankRecord, RunRecord
from distdoctor.models.calls import (
    direction,
    grouped,
    is_collective,
    is_point_to_point,
    ranks_phrase,
    relative_line,
)
from distdoctor.models.record import CRASHED, ENDED, STOPPED, is_user_frame, started_by, user_frame

NAME = "hang"
# a family: the causes of a stopped run this check tells apart, each its own kind
KINDS: tuple[CauseKind, ...] = ("collective-mismatch", "p2p-cycle", "group-cycle",
                                "rank-exited-early", "rank-crashed", "busy-rank",
                                "hang-unknown")


def check(record: RunRecord) -> list[Finding]:
    stopped = [r for r in record.ranks if r.end.status in STOPPED]
    if not stopped:
        return []
    blocked = {r.rank: blocking_call(r) for r in stopped}
    edges = wait_edges(record)
    calls = {r.rank: call.describe(relative=True) if (call := blocked[r.rank]) else
             _from_stack(r) for r in stopped}
    measured = {"blocked_in": {str(k): v for k, v in calls.items()},
                "wait_for": {str(k): sorted(v) for k, v in edges.items()}}
    listing = "; ".join(grouped(calls))

    parting = parting_of(record.ranks)
    if parting is not None:  # whatever followed, it follows from the calls that parted
        return [parted(parting, len(record.ranks), NAME)]
    cycle = cycle_of(edges)
    in_cycle = [blocked[r] for r in cycle or ()]
    p2p = [c for c in in_cycle if c is not None and is_point_to_point(c.op)]
    if cycle and len(p2p) == len(in_cycle):
        kinds = {direction(c.op) for c in p2p}
        ring = " -> ".join(map(str, cycle + [cycle[0]]))
        if kinds == {"send"}:
            return [finding(
                "send-before-receive", check=NAME, headline=f"send cycle {ring}",
                symptom=f"ranks {ring} each wait in a blocking send for the next, which is itself "
                f"sending: nobody receives. Every blocked rank: {listing}",
                fix_changes={"knobs.p2p_order": "even-odd"}, ranks=cycle,
                measured={**measured, "cycle": cycle},
                kind="p2p-cycle")]
        return [_uncatalogued(
            "p2p-cycle", f"p2p cycle {ring}",
            f"ranks {ring} each wait for the next in a point-to-point call "
            f"({' and '.join(sorted(kinds))}) that never matches. Every blocked rank: {listing}",
            "the ranks' sends and receives are ordered so that each waits for the other",
            "order each pair so one side sends while the other receives (even ranks send "
            "first, odd ranks receive first), or use isend/irecv and wait on both",
            cycle, {**measured, "cycle": cycle})]

    if cycle and all(c is not None for c in in_cycle) and \
            len({(c.group, c.pg) for c in in_cycle if c is not None}) > 1 and \
            len({c.where for c in in_cycle if c is not None}) > 1 and \
            _each_waits_for_a_call_never_made(cycle, blocked, record):
        # (one line whose group differs by rank is that line's fault: _missing names it)
        return [_group_cycle(cycle, [c for c in in_cycle if c is not None], listing,
                             measured)]
    missing = _missing(blocked, record)
    if missing:
        return [missing]
    busy = _busy([r.rank for r in stopped], blocked, record)
    if busy and len(stopped) == len(record.ranks) and all(
            _in_own_code(record.ranks[r].end) for r in busy):
        return [_all_busy(busy, record)]
    return [_uncatalogued(
        "hang-unknown", f"{len(stopped)} ranks stopped",
        f"no rank made progress and no cycle or missing rank explains it. "
        f"Every blocked rank: {listing}", "unknown from the calls alone",
        "look at the lines each rank is blocked on", [r.rank for r in stopped], measured)]


def _missing(blocked: dict[int, Call | None], record: RunRecord) -> Finding | None:
    """Ranks in a collective that others never joined. Of several such calls, the most
    specific: one that only its ranks made (the absent ones wait in other collectives and
    never made it at its line); else one whose absent ranks wait for nobody, the root of
    the wait-for chain (a rank stuck in its own code, or gone); else the first."""
    joined = joined_by(record)
    calls: dict[tuple, Call] = {}  # one per collective: the first rank's call in it
    for blocking in blocked.values():
        if blocking and is_collective(blocking.op):
            calls.setdefault((blocking.group, blocking.pg, blocking.seq), blocking)
    candidates = [(call, sorted(waits_for(call, record, joined))) for call in calls.values()]
    candidates = [(call, absent) for call, absent in candidates if absent]
    if not candidates:
        return None
    only = [(c, a) for c, a in candidates if _only_some_call(c, a, record, blocked)]
    roots = [(c, a) for c, a in candidates if not any(blocked.get(r) for r in a)]
    call, absent = only[0] if only else min(roots, key=lambda ca: len(ca[1])) if roots \
        else candidates[0]
    inside = sorted(r for r, c in blocked.items() if c and same_collective(c, call))
    where = "; ".join(grouped({r: _whereabouts(record.ranks[r], blocked.get(r))
                               for r in absent}))
    if only:
        return _uncatalogued(
            "collective-mismatch",
            f"{call.op} #{call.seq} on {ranks_phrase(inside)} only",
            f"{ranks_phrase(inside)} wait{'s' * (len(inside) == 1)} in "
            f"{call.describe(relative=True)}, "
            f"a call {ranks_phrase(absent)} never made there, while "
            + "; ".join(grouped({r: _whereabouts(record.ranks[r], blocked.get(r))
                                 for r in absent}, " is ")),
            "a collective that only some ranks make (a rank-dependent branch): the others "
            "went on to other collectives (their own, or those torch makes itself), which "
            "never pair with it",
            f"make every rank of the group make the {call.op} at {relative_line(call.where)}, "
            f"or none", inside,
            {"seq": call.seq, "missing": absent, "waiting": inside},
            where=(relative_line(call.where),))
    busy = _busy(absent, blocked, record)
    if busy:
        return busy_rank(call, inside, busy, record)
    # a rank that finished while the others still expected it is the root; ranks
    # that failed or were stopped on their way (still starting, when it left) follow.
    # Absent ranks that all crashed (raised, or died) are the crash's to name: their
    # peers waited for them only because the error grace ended first (a loaded machine)
    left = [r for r in absent if record.ranks[r].end.status == "finished"]
    crashed = all(record.ranks[r].end.status in CRASHED for r in absent)
    return _uncatalogued(
        "rank-exited-early" if left else
        "rank-crashed" if crashed else "collective-mismatch",
        f"{ranks_phrase(absent)} missing from {call.op} #{call.seq}",
        f"{ranks_phrase(inside)} wait{'s' * (len(inside) == 1)} in "
        f"{call.describe(relative=True)} for "
        f"{ranks_phrase(absent)}, which "
        f"never joined it ({where})",
        "a collective that not every rank of the group calls (a rank-dependent branch, "
        "a loop that ends early on some ranks, or a rank that left)",
        "make every rank of the group make the same collective calls", left or absent,
        {"seq": call.seq, "missing": absent, "waiting": inside},
        where=(relative_line(call.where),))


def _busy(absent: list[int], blocked: dict[int, Call | None], record: RunRecord
          ) -> dict[int, str]:
    """rank -> where it was, when every absent rank was stopped running its own code: in no
    traced call and in no collective torch made itself, at a line of the user's."""
    found = {}
    for rank in absent:
        end = record.ranks[rank].end
        frame = end.running_at
        if end.status not in STOPPED or end.collective or blocked.get(rank) or frame is None:
            return {}
        found[rank] = f"{frame.function} at {relative_line(frame.place)}"
    return found


def busy_rank(call: Call, waiting: list[int], busy: dict[int, str],
              record: RunRecord) -> Finding:
    """The busy ranks' own verdict: not a mismatch (they never made another call), but
    work in their own code on the path to a collective the others already wait in."""
    running, lines = _ran(busy, record)
    return _uncatalogued(
        "busy-rank", f"{ranks_phrase(busy)} busy in its own code",
        f"{'; '.join(grouped(running, ' ran '))}, in no collective or send/receive, while "
        f"{ranks_phrase(waiting)} wait{'s' * (len(waiting) == 1)} for it in "
        f"{call.describe(relative=True)}",
        "work on some ranks only (validation, logging, a check, a loop waiting for a "
        "condition) stands between them and a collective the others already wait in",
        f"move the work at {', '.join(lines)} off the path to the collective (after the "
        f"step, on a thread, or on every rank alike), or raise the deadline if it is "
        f"meant to take this long", sorted(busy),
        {"seq": call.seq, "busy": {str(r): w for r, w in busy.items()}, "waiting": waiting},
        where=(*lines, relative_line(call.where)))


def _in_own_code(end) -> bool:
    """Was the rank's main thread executing the user's own code when stopped (its innermost
    frame the user's), not inside a library call that may wait in a collective torch made
    itself (DDP's, which a trace without the Flight Recorder's word cannot see)?"""
    main = next((s for s in end.stacks if s.main), None)
    return main is not None and bool(main.frames) and is_user_frame(main.frames[-1])


def _all_busy(busy: dict[int, str], record: RunRecord) -> Finding:
    """Every rank stopped in its own code, none in a call: nobody waits for anybody, so no
    peer is to blame; the loop or the work at their lines is what never ends."""
    running, lines = _ran(busy, record)
    return _uncatalogued(
        "busy-rank", f"{ranks_phrase(busy)} busy in their own code",
        f"{'; '.join(grouped(running, ' ran '))}, in no collective or send/receive, and no "
        f"rank waits in a call: the work at {', '.join(lines)} itself does not end",
        "a loop whose exit condition never comes true on these ranks (a value no rank "
        "ever sends, a count that never reaches its target), or work longer than the "
        "deadline",
        f"look at the loop at {', '.join(lines)}: what should make it end, and whether "
        f"any rank makes that happen; or raise the deadline if it is meant to take this "
        f"long", sorted(busy), {"busy": {str(r): w for r, w in busy.items()}},
        where=lines)


def _ran(busy: dict[int, str], record: RunRecord) -> tuple[dict[int, str], tuple[str, ...]]:
    """What each busy rank ran and for how long ("f at t.py:9 for 2.0 s"), and the
    lines they ran at, each once, in the ranks' order."""
    running = {r: where + _for(record.ranks[r], record) for r, where in busy.items()}
    return running, tuple(dict.fromkeys(where.rsplit(" at ", 1)[1] for where in busy.values()))


def _for(rank: RankRecord, record: RunRecord) -> str:
    """" for 2.0 s": from the end of the rank's last call (or the job's start) to its stop;
    "" where its stop was not timed (a trace read afterwards: the rank was stopped by
    whoever ended the job, at a moment it did not write down)."""
    if rank.end.at is None:
        return ""
    ended = [c.completed for c in rank.evidence.calls if c.completed is not None]
    since = max(ended) if ended else record.started
    return f" for {max(0.0, record.started + rank.end.at - since):.1f} s"


def _only_some_call(call: Call, absent: list[int], record: RunRecord,
                    blocked: dict[int, Call | None]) -> bool:
    """Is ``call`` the one that differs? Every absent rank waits in another collective
    (one torch made itself, DDP's, seen by the Flight Recorder; or a call of its own on
    another group or number), not missing: it waits for the others as they wait for it,
    and it never made this call at this line (by its calls or its recorder's history).
    Then the ranks in the call are to blame, not the ranks that only wait."""
    def elsewhere(rank: int) -> bool:
        end, own = record.ranks[rank].end, blocked.get(rank)
        return end.status in STOPPED and bool(
            end.collective or own is not None and is_collective(own.op)
            and not same_collective(own, call))

    return all(elsewhere(r) and not _made_at(call, record.ranks[r]) for r in absent)


def _made_at(call: Call, rank: RankRecord, same_group: bool = False) -> bool:
    """Has ``rank`` made ``call``'s op at its line (on its group, with ``same_group``), by
    its traced calls or its recorder's history?"""
    return any(c.op == call.op and c.where == call.where and
               (not same_group or (c.group, c.pg) == (call.group, call.pg))
               for c in rank.evidence.calls) \
        or any(r.op == call.op and r.where == call.where for r in rank.end.recorded)


def _whereabouts(rank: RankRecord, call: Call | None) -> str:
    if rank.end.status == "finished" and rank.end.error:  # gone without a word: no dump
        return rank.end.error
    if rank.end.status in ENDED:
        return f"it {rank.end.status}"
    return f"blocked in {call.describe(relative=True)}" if call else _from_stack(rank)


def _from_stack(rank: RankRecord) -> str:
    """Where a rank in no traced call was: the innermost frame of the user's own code, and
    the collective it was in if torch made it itself (DDP's, from C++)."""
    frame = user_frame(rank.end.stacks) if rank.end.collective else rank.end.running_at
    place = f"{frame.function} at {relative_line(frame.place)}" if frame else ""
    if rank.end.collective:
        return rank.end.collective + (
            f", {started_by(replace(frame, file=relative_line(frame.file)))}" if frame else "")
    if frame is not None:
        return f"in no collective or send/receive: running {place}"
    if rank.end.error and not rank.end.stacks:  # what its own evidence says (a dump's)
        return rank.end.error
    return "in no traced call, and no stack of the user's code"


def _each_waits_for_a_call_never_made(cycle: list[int], blocked: dict[int, Call | None],
                                      record: RunRecord) -> bool:
    """An order cycle, not an extra call: every rank of the cycle waits in a call (its op,
    group and line) that the rank it waits for has never made, by its calls or its
    recorder's history. An extra call on one rank also makes a cycle of waits, but only
    its own call is one the others never made; they wait at lines it has run before, and
    the extra call is the cause (_missing names it)."""
    calls = [blocked.get(r) for r in cycle]
    return all(call is not None and
               not _made_at(call, record.ranks[cycle[(i + 1) % len(cycle)]], same_group=True)
               for i, call in enumerate(calls))


def _group_cycle(cycle: list[int], calls: list[Call], listing: str,
                 measured: dict) -> Finding:
    """Ranks that each wait for the next in a call on another group (or channel): every
    group has its own connections, so each call waits for a rank that is itself waiting
    elsewhere. Every rank and every call of the cycle is at fault: their order."""
    ring = " -> ".join(map(str, cycle + [cycle[0]]))
    said = "; ".join(f"rank {r} in {c.describe(relative=True)} (a group of "
                     f"{ranks_phrase(c.group)}), waiting for rank {cycle[(i + 1) % len(cycle)]}"
                     for i, (r, c) in enumerate(zip(cycle, calls)))
    lines = tuple(dict.fromkeys(relative_line(c.where) for c in calls))
    return _uncatalogued(
        "group-cycle", f"wait cycle {ring} across groups",
        f"ranks {ring} each wait for the next in a call on another process group: {said}. "
        f"Every blocked rank: {listing}",
        "the ranks use their process groups in different orders: each group has its own "
        "connections, so each rank waits in one group for a rank that waits in another",
        f"make every rank use the groups in one order ({' and '.join(lines)}): the same "
        f"calls on the same groups in the same sequence, whatever the rank",
        sorted(cycle), {**measured, "cycle": cycle}, where=lines)


def _uncatalogued(kind: CauseKind, headline: str, symptom: str, cause: str, fix: str,
                  ranks, measured: dict, where: tuple[str, ...] = ()) -> Finding:
    """A finding of a failure mode the fault catalogue cannot inject into the built-in
    workload (it has no knob): its one name is the cause a user is told, ``kind``."""
    return Finding(check=NAME, fault=kind, symptom=symptom, cause=cause, fix=fix,
                   fix_changes={}, ranks=tuple(ranks), measured=measured, headline=headline,
                   kind=kind, where=where)
