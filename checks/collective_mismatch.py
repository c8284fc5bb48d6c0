"""Did the ranks make the same calls? Every collective, and every send against its receive.

Calls that should meet share a sequence number: the k-th collective on a group, or the
k-th send from a to b and the k-th receive at b from a. gloo lets some mismatches through
silently (SUM on one rank, MAX on another; shape [4] against [2, 2]) and answers others by
aborting one rank ("Received data size doesn't match expected size") while the rest see
only "Connection reset by peer". Either way the mismatch is the root cause. Runs that
hung are left to the hang check, which names mismatches among the calls blocked.
"""

from __future__ import annotations

from distdoctor.models import Call, Finding, RunRecord
from distdoctor.models.calls import RECEIVES, SENDS, is_collective, is_point_to_point
from distdoctor.models.waitfor import STOPPED

NAME = "collective_mismatch"


def check(record: RunRecord) -> list[Finding]:
    if any(r.end.status in STOPPED for r in record.ranks):
        return []
    return _collectives(record) or _point_to_point(record)


ROOT_LISTS = ("scatter", "gather")  # the root alone passes the list (scatter_list, gather_list)


def _signature(call: Call) -> tuple:
    """What must agree across ranks. Of a scatter or gather, only the tensor every rank
    passes: the root's list is its own (torch's distribute_tensor scatters this way)."""
    shapes = call.shapes[:1] if call.op in ROOT_LISTS else call.shapes
    return (call.op, call.peer, shapes, call.dtype, call.reduce_op)


def _collectives(record: RunRecord) -> list[Finding]:
    slots: dict[tuple, dict[int, Call]] = {}
    for rank in record.ranks:
        for call in rank.evidence.calls:
            if is_collective(call.op):
                slots.setdefault((call.group, call.pg, call.seq), {})[rank.rank] = call
    for (group, _, seq), calls in sorted(slots.items(), key=lambda item: item[0][2]):
        if len({_signature(c) for c in calls.values()}) > 1:
            return [_finding(f"collective #{seq} on group {list(group)}", calls)]
    return []


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
    listing = "; ".join(f"rank {rank}: {call.describe(relative=True)}"
                        for rank, call in sorted(calls.items()))
    pair = all(is_point_to_point(c.op) for c in calls.values())  # a send against its receive: their
    # ops and peers differ by nature
    differs = [name for name, index in (("op", 0), ("root or peer", 1), ("shape", 2),
                                        ("dtype", 3), ("reduce op", 4))
               if len({_signature(c)[index] for c in calls.values()}) > 1
               and not (pair and name in ("op", "root or peer"))]
    return Finding(
        check=NAME, fault="collective-mismatch",
        headline=f"{' and '.join(differs) or 'call'} "
                 f"{'differ' if len(differs) > 1 else 'differs'} at {what.split(' on ')[0]}",
        symptom=f"the ranks' {what} differ in {', '.join(differs) or 'their calls'}: {listing}",
        cause="the ranks issued different calls (or different shapes, dtypes or reduce ops) "
              "at the same point in their sequence; any connection errors on other ranks "
              "follow from this",
        fix="make every rank issue the same collectives in the same order with the same "
            "shapes, dtypes and reduce ops, and match each send with a receive of the same "
            "shape and dtype",
        kind="collective-mismatch", fix_changes={}, ranks=tuple(sorted(calls)), measured={
            "calls": {str(k): v.describe(relative=True) for k, v in calls.items()},
            "differs": differs})
