"""Did the ranks make the same calls? Every collective, and every send against its receive.

Calls that should meet share a sequence number: the k-th collective on a group, or the
k-th send from a to b and the k-th receive at b from a. gloo lets some mismatches through
silently (SUM on one rank, MAX on another; shape [4] against [2, 2]) and answers others by
aborting one rank ("Received data size doesn't match expected size") while the rest see
only "Connection reset by peer". Either way the mismatch is the root cause: the first number at
which a group's collectives part (analysis/sequences.py), blamed on the odd ranks out. Runs
that hung are left to the hang check, which names the same parting first.
"""

from __future__ import annotations

from distdoctor.analysis.sequences import Parting, parting_of
from distdoctor.models import Call, Finding, RunRecord
from distdoctor.models.calls import NEW_GROUP, RECEIVES, SENDS, ranks_phrase, relative_line
from distdoctor.models.record import STOPPED

NAME = "collective_mismatch"


def check(record: RunRecord) -> list[Finding]:
    if any(r.end.status in STOPPED for r in record.ranks):
        return []  # the hang check names a parting among ranks that were stopped
    return _collectives(record) or _point_to_point(record)


def _collectives(record: RunRecord) -> list[Finding]:
    """The traced calls' first parting; else, where every rank's Flight Recorder history
    is known (dumps of a job that went on, or finished), theirs."""
    found = parting_of(record.ranks)
    return [parted(found, len(record.ranks), NAME)] if found else []


FIELDS = ("op", "root or peer", "shape", "dtype", "reduce op")  # agreement()'s, in order


def parted(parting: Parting, world: int, check: str) -> Finding:
    """The finding of a group whose collectives parted (the hang check's too, for a run
    that hung after it): the odd ranks out, their line first, the others' after it."""
    differs = [name for index, name in enumerate(FIELDS)
               if len({s.made.key[index] for s in parting.sides}) > 1]
    culprits = ranks_phrase(parting.culprits)
    line = parting.lines[0] if parting.lines else "the line it names"
    op = parting.sides[0].made.key[0]
    creation = any(s.made.key[0] == NEW_GROUP for s in parting.sides)
    if creation:  # a group's members are what its "shape" says
        differs = ["members" if name == "shape" else name for name in differs]
    if parting.blame == "even":
        cause = ("the ranks made different collectives (or different shapes, dtypes or "
                 "reduce ops) at the same point of their sequence, and no side stands out")
        fix = ("make every rank make the same collectives in the same order with the same "
               "shapes, dtypes and reduce ops (" + " or ".join(parting.lines) + ")")
    else:
        cause = (f"{culprits} made a call the rest of the group did not make there (a "
                 f"rank-dependent branch: logging, a metric, a check); gloo may pair it with "
                 f"the others' next call, so every hang or error after it follows from it")
        fix = (f"make every rank of the group make the {op} at {line}, or none"
               if parting.blame in ("extra", "own-line") or differs == ["op"]
               or any(s.extra for s in parting.sides) else
               f"make {culprits} make the call the others make at {parting.lines[-1]} "
               f"(the same shapes, dtypes and reduce op), or every rank make the one at "
               f"{line}")
    if creation:
        cause = (f"{culprits} made a process group the rest of the default group did not "
                 f"make there: torch's new_group (new_subgroups, init_device_mesh) is a "
                 f"collective of every rank of the default group, members or not, in one "
                 f"order; a later group's creation, or its first collective, waits forever")
        fix = (f"call new_group at {line} on every rank, members or not, in the same order "
               f"(create every group up front, then branch on membership), or pass "
               f"use_local_synchronization=True there so that only its members make it")
    if parting.began is not None:
        number, theirs, _ = parting.began
        cause = (f"{culprits} made a collective the others did not make there ({theirs}); "
                 f"the others' next call was of the same kind and size, so gloo paired "
                 f"them, and every number after it meant something else on each side")
        fix = (f"make the call at {line} on every rank of the group or on none (a forward "
               f"through DDP's wrapper makes DDP's buffer broadcast: on one rank, call "
               f"model.module(...) there, or run it under torch.no_grad(); a gather of a "
               f"sharded state, full_tensor(), must run on every rank)")
    return Finding(
        check=check, fault="collective-mismatch", kind="collective-mismatch",
        headline=f"{' and '.join(differs) or 'call'} "
                 f"{'differ' if len(differs) > 1 else 'differs'} at "
                 + (f"collective #{parting.seq}" if parting.seq >= 0 else
                    "the current collective"),
        symptom=f"the ranks' {parting.where_said()} differs in {', '.join(differs)}: "
                f"{parting.sentence(world)}",
        cause=cause, fix=fix, fix_changes={}, ranks=parting.culprits, where=parting.lines,
        measured={"seq": parting.seq, "blame": parting.blame, "differs": differs,
                  "calls": {str(r): s.made.text for s in parting.sides for r in s.ranks}})


def _point_to_point(record: RunRecord) -> list[Finding]:
    sends: dict[tuple, Call] = {}
    recvs: dict[tuple, Call] = {}
    for rank in record.ranks:
        for call in rank.evidence.calls:
            channel = (call.pg or "", call.tag, call.seq)  # as gloo pairs them
            if call.op in SENDS:
                sends[(rank.rank, call.peer, channel)] = call
            elif call.op in RECEIVES and call.peer is not None:
                recvs[(call.peer, rank.rank, channel)] = call
    for key in sorted(set(sends) & set(recvs)):
        send, recv = sends[key], recvs[key]
        if (send.shapes, send.dtype) != (recv.shapes, recv.dtype):
            return [_finding(f"send #{key[2][2]} from rank {key[0]} to rank {key[1]}",
                             {key[0]: send, key[1]: recv})]
    return []


def _finding(what: str, calls: dict[int, Call]) -> Finding:
    """A send against its receive: only shapes and dtypes can differ (their ops and peers
    differ by nature)."""
    listing = "; ".join(f"rank {rank}: {call.describe(relative=True)}"
                        for rank, call in sorted(calls.items()))
    differs = [name for name, field in (("shape", "shapes"), ("dtype", "dtype"))
               if len({getattr(c, field) for c in calls.values()}) > 1]
    return Finding(
        check=NAME, fault="collective-mismatch",
        headline=f"{' and '.join(differs)} {'differ' if len(differs) > 1 else 'differs'} "
                 f"at {what}",
        symptom=f"the ranks' {what} differ in {', '.join(differs)}: {listing}",
        cause="a send and the receive it pairs with disagree on the tensor; any connection "
              "errors on other ranks follow from this",
        fix="match each send with a receive of the same shape and dtype",
        kind="collective-mismatch", fix_changes={}, ranks=tuple(sorted(calls)),
        where=tuple(relative_line(c.where) for _, c in sorted(calls.items()) if c.where),
        measured={"calls": {str(k): v.describe(relative=True) for k, v in calls.items()},
                  "differs": differs})
