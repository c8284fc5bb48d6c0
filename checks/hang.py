"""Why did the ranks stop? The wait-for graph of a hung run, and the cause it shows.

Every rank that was stopped (hung, or still running after a peer failed) is blocked in the
last call its tracer saw it enter without leaving. Each blocking call is an edge to the
ranks it waits for: a send or receive waits for its peer; a collective waits for the ranks
of its group that never entered the same collective (same group, same sequence number).
The cause, in order of precedence:

* a cycle of point-to-point calls: every rank in it waits for the next (all sending first
  is the send-before-receive deadlock; all receiving first is its mirror);
* ranks at the same collective sequence number with different ops, shapes, dtypes or
  reduce ops;
* a rank missing from a collective the others are in (and where it is instead);
* otherwise, each rank's blocking call, so a person can take it from there.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from distdoctor.checks import finding, rank_list
from distdoctor.models import Call, Finding, RankRecord, RunRecord
from distdoctor.models.record import started_by, user_frame
from distdoctor.trace.waitfor import cycle_of

NAME = "hang"
STOPPED = ("hung", "stopped")
P2P = ("send", "recv", "isend", "irecv", "batch_isend_irecv")


def check(record: RunRecord) -> list[Finding]:
    stopped = [r for r in record.ranks if r.end.status in STOPPED]
    if not stopped:
        return []
    blocked = {r.rank: _blocking_call(r) for r in stopped}
    edges = wait_edges(record)
    calls = {r.rank: describe(blocked[r.rank]) if blocked[r.rank] else _from_stack(r)
             for r in stopped}
    measured = {"blocked_in": {str(k): v for k, v in calls.items()},
                "wait_for": {str(k): sorted(v) for k, v in edges.items()}}
    listing = "; ".join(f"rank {k}: {v}" for k, v in sorted(calls.items()))

    cycle = cycle_of(edges)
    if cycle and all(blocked[r].op in P2P for r in cycle):
        kinds = {_direction(blocked[r]) for r in cycle}
        ring = " -> ".join(map(str, cycle + [cycle[0]]))
        if kinds == {"send"}:
            return [finding(
                "send-before-receive", NAME, f"send cycle {ring}",
                f"ranks {ring} each wait in a blocking send for the next, which is itself "
                f"sending: nobody receives. Every blocked rank: {listing}",
                {"knobs.p2p_order": "even-odd"}, cycle, {**measured, "cycle": cycle})]
        return [_uncatalogued(
            "p2p-cycle", f"p2p cycle {ring}",
            f"ranks {ring} each wait for the next in a point-to-point call "
            f"({' and '.join(sorted(kinds))}) that never matches. Every blocked rank: {listing}",
            "the ranks' sends and receives are ordered so that each waits for the other",
            "order each pair so one side sends while the other receives (even ranks send "
            "first, odd ranks receive first), or use isend/irecv and wait on both",
            cycle, {**measured, "cycle": cycle})]

    mismatch = _collective_mismatch(blocked, record)
    if mismatch:
        return [mismatch]
    missing = _missing(blocked, record)
    if missing:
        return [missing]
    return [_uncatalogued(
        "hang-unknown", f"{len(stopped)} ranks stopped",
        f"no rank made progress and no cycle or missing rank explains it. "
        f"Every blocked rank: {listing}", "unknown from the calls alone",
        "look at the lines each rank is blocked on", [r.rank for r in stopped], measured)]


def wait_edges(record: RunRecord) -> dict[int, set[int]]:
    """Whom each stopped rank waits for, from the call it is blocked in (the wait-for
    graph the hang is judged on; the pictures draw it)."""
    stopped = [r for r in record.ranks if r.end.status in STOPPED]
    blocked = {r.rank: _blocking_call(r) for r in stopped}
    return {rank: _waits_for(call, record) for rank, call in blocked.items() if call}


def describe(call: Call) -> str:
    """'send to 3 (#1, [2, 32, 16] float32) at handrolled.py:52'."""
    target = (f" to {call.peer}" if call.op in ("send", "isend") else
              f" from {call.peer}" if call.op in ("recv", "irecv") else
              f" rooted at {call.peer}" if call.peer is not None else "")
    number = f"#{call.seq}" + (f" on process group {call.pg}" if call.pg else "")
    detail = ", ".join(filter(None, [number, " ".join(map(str, call.shapes)),
                                     call.dtype, call.reduce_op or ""]))
    where = call.wait_where if call.async_op and call.wait_where else call.where
    return f"{call.op}{target} ({detail}) at {_short(where)}"


def _blocking_call(rank: RankRecord) -> Call | None:
    blocking = [c for c in rank.evidence.calls if c.blocking]
    return blocking[-1] if blocking else None


def _direction(call: Call) -> str:
    return "send" if call.op in ("send", "isend") else "recv"


def _waits_for(call: Call, record: RunRecord) -> set[int]:
    if call.op == "batch_isend_irecv":
        return {peer for _, peer in call.peers}
    if call.op in P2P:
        return {call.peer}
    joined = {r.rank for r in record.ranks
              if any(_same_collective(c, call) for c in r.evidence.calls)}
    return set(call.group or range(len(record.ranks))) - joined


def _same_collective(a: Call, b: Call) -> bool:
    return a.op not in P2P and (a.group, a.pg, a.seq) == (b.group, b.pg, b.seq)


def _collective_mismatch(blocked: dict[int, Call | None], record: RunRecord) -> Finding | None:
    for call in (c for c in blocked.values() if c and c.op not in P2P):
        peers = {r.rank: c for r in record.ranks for c in r.evidence.calls
                 if _same_collective(c, call)}
        signature = {rank: (c.op, c.peer, c.shapes, c.dtype, c.reduce_op)
                     for rank, c in peers.items()}
        if len(set(signature.values())) > 1:
            listing = "; ".join(f"rank {rank}: {describe(c)}" for rank, c in sorted(peers.items()))
            return _uncatalogued(
                "collective-mismatch", f"mismatch at {call.op} #{call.seq}",
                f"the ranks' collective #{call.seq} on group {list(call.group)} differs: "
                f"{listing}", "the ranks issued different collectives (or different shapes, "
                "dtypes or reduce ops) at the same point in their sequence",
                "make every rank issue the same collectives in the same order with the same "
                "shapes, dtypes and reduce ops", sorted(peers),
                {"seq": call.seq, "calls": {str(k): describe(v) for k, v in peers.items()}})
    return None


def _missing(blocked: dict[int, Call | None], record: RunRecord) -> Finding | None:
    for call in (c for c in blocked.values() if c and c.op not in P2P):
        absent = sorted(_waits_for(call, record))
        if not absent:
            continue
        inside = sorted(r for r, c in blocked.items() if c and _same_collective(c, call))
        where = "; ".join(f"rank {r}: {_whereabouts(record.ranks[r], blocked.get(r))}"
                          for r in absent)
        if _only_some_call(call, absent, record):
            return _uncatalogued(
                "unmatched-collective", f"{call.op} #{call.seq} on {rank_list(inside)} only",
                f"{rank_list(inside)} wait{'s' * (len(inside) == 1)} in {describe(call)}, "
                f"a call {rank_list(absent)} never made there, while "
                + "; ".join(f"rank {r} is {_from_stack(record.ranks[r])}" for r in absent),
                "a collective that only some ranks make (a rank-dependent branch): the others "
                "went on to the collectives torch makes itself, which never pair with it",
                f"make every rank of the group make the {call.op} at {_short(call.where)}, "
                f"or none", inside,
                {"seq": call.seq, "missing": absent, "waiting": inside})
        return _uncatalogued(
            "missing-from-collective", f"{rank_list(absent)} missing from {call.op} #{call.seq}",
            f"{rank_list(inside)} wait{'s' * (len(inside) == 1)} in {describe(call)} for "
            f"{rank_list(absent)}, which "
            f"never joined it ({where})",
            "a collective that not every rank of the group calls (a rank-dependent branch, "
            "a loop that ends early on some ranks, or a rank that left)",
            "make every rank of the group make the same collective calls", absent,
            {"seq": call.seq, "missing": absent, "waiting": inside})
    return None


def _only_some_call(call: Call, absent: list[int], record: RunRecord) -> bool:
    """Is ``call`` the one that differs? Every absent rank is waiting in a collective torch
    made itself (DDP's, seen by the Flight Recorder), not missing: it waits for the others
    as they wait for it, and it never made this call at this line. Then the ranks in the
    call are to blame, not the ranks that only wait."""
    return all(record.ranks[r].end.status in STOPPED and record.ranks[r].end.collective
               and not any(c.op == call.op and c.where == call.where
                           for c in record.ranks[r].evidence.calls)
               for r in absent)


def _whereabouts(rank: RankRecord, call: Call | None) -> str:
    if rank.end.status in ("finished", "raised", "died"):
        return f"it {rank.end.status}"
    return f"blocked in {describe(call)}" if call else _from_stack(rank)


def _from_stack(rank: RankRecord) -> str:
    """Where a rank in no traced call was: the innermost frame of the user's own code, and
    the collective it was in if torch made it itself (DDP's, from C++)."""
    frame = user_frame(rank.end.stacks)
    place = f"{frame.function} at {_short(frame.file)}:{frame.line}" if frame else ""
    if rank.end.collective:
        return rank.end.collective + (
            f", {started_by(replace(frame, file=_short(frame.file)))}" if frame else "")
    if frame is not None:
        return f"in no collective or send/receive: running {place}"
    return "in no traced call, and no stack of the user's code"


def _short(where: str) -> str:
    """file:line (or a file), relative to the working directory when the file is under it."""
    path, _, line = where.rpartition(":")
    if not path or not line.isdigit():
        path, line = where, ""
    try:
        path = str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        pass
    return f"{path}:{line}" if line else path


def _uncatalogued(kind: str, headline: str, symptom: str, cause: str, fix: str, ranks,
                  measured: dict) -> Finding:
    return Finding(check=NAME, fault=kind, symptom=symptom, cause=cause, fix=fix,
                   fix_changes={}, ranks=tuple(ranks), measured=measured, headline=headline)
