"""Who waits for whom, kept live from the trace stream, and when a hang is provable.

A deadline can only guess: a slow step and a deadlock look alike to a timer. Most hangs
can instead be proven from the calls the tracer records. A rank blocked in a blocking call
(or waiting on an asynchronous one) waits for the ranks that have not yet entered the
call that would match it: a send #k to P waits for P's receive #k from this rank, a
collective #s on a group for every member that has not entered #s. A rank that waits
for a rank which finished can never go on; nor can one that waits for a rank which is
itself stuck. The stuck ranks are the greatest set closed under that rule (every member of
a cycle is in it), plus ranks blocked together in different collectives at the same
sequence number. A send and a receive pair by peer, group and tag, in order, as gloo pairs
them. Ranks that compute, and ranks whose calls counting cannot pair (a call off the main
thread, which another thread may follow with the call a peer needs; a receive from any
source) are left out of every proof, and so to the deadline.

The tracer numbers only the calls made through torch.distributed's Python functions; gloo
pairs every collective of a group, DDP's own from C++ included, and a list reduce_scatter
is two of its all-reduces. Where torch's Flight Recorder is read (dumps/live.py, asked for by
the watch), a collective's place is its number there instead, taken while the rank is
still in the same call: a member waits for it while it has not enqueued that number, and
a member that put another kind of collective at that number (even one the tracer never
saw) proves the call can never complete.

Only ``enter``, ``wait``, ``done``, ``error`` and ``exit`` lines are read; everything else
in the stream is skipped without parsing. A proof is believed once it has held unchanged
for CONFIRM_S (``Confirmation``), by whichever watcher asks: the parent under ``distdoctor
run`` and the plugin, or a rank's own watch under torchrun (userjob/watching/dirwatch.py).

The same graph after the fact, from a RunRecord's calls (``wait_edges``), is what the hang
check judges and the pictures draw: one module says who waits for whom, live or later.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from distdoctor.analysis.sequences import Made, agreement, parting_at
from distdoctor.analysis.startup import never_forms, startup_of
from distdoctor.models.calls import (
    BATCH,
    RECEIVES,
    describe_call,
    direction,
    grouped,
    is_collective,
    is_point_to_point,
    ranks_phrase,
    relative_line,
)
from distdoctor.models.events import CALL_EVENTS, Ev
from distdoctor.models.evidence import Call, Startup
from distdoctor.models.record import STOPPED, RankRecord, RunRecord

_CALL_EVENTS = tuple(f'{{"ev":"{kind}"'.encode() for kind in CALL_EVENTS)  # as written
_EXIT_EVENT = f'{{"ev":"{Ev.EXIT}"'.encode()
_INIT_EVENT = f'{{"ev":"{Ev.INIT}"'.encode()  # a rank entering init_process_group
_JOINED_EVENT = f'{{"ev":"{Ev.JOINED}"'.encode()  # ... and its group formed
# Collectives gloo runs with one algorithm, so that one rank in each still completes (or
# one side does): measured on torch 2.13 gloo, 2 ranks, every other pair of ops hangs, and
# so do rooted ops with different roots. Shapes, dtypes and reduce ops are not compared: a
# difference there crashes at once (sizes) or completes silently (SUM vs MAX, [4] vs [2, 2]).
_FAMILY = {"reduce_scatter": "all_reduce", "reduce_scatter_tensor": "all_reduce",
           "reduce_scatter_single": "all_reduce", "all_gather_into_tensor": "all_gather",
           "all_gather_single": "all_gather", "all_to_all_single": "all_to_all"}


@dataclass(frozen=True)
class Deadlock:
    """A proven hang: its kind, the stuck ranks, the open call of each (rank -> call id,
    to confirm it is still the same later) and a sentence."""

    kind: str  # "cycle", "mismatch", "exited", "parted" (a group's history differs), or
    # "startup" (a group that can never form: analysis/startup.py)
    ranks: tuple[int, ...]
    calls: tuple[tuple[int, int], ...]
    text: str


# DISTDOCTOR_PROOF=0: the deadline alone decides (to measure what the proof saves, or to
# rule it out), in every watcher; read when each watch starts
PROOF_SWITCH = "DISTDOCTOR_PROOF"
PROVEN = "deadlock proven"  # how a proven hang's ends begin (a timed-out one names the deadline)
CONFIRM_S = 0.15  # a proven hang must still hold, with no new line from its ranks, this long


class Confirmation:
    """A proof is believed once it has stood for CONFIRM_S: the same calls still open and
    not a byte more from its ranks (``seen``, whatever the watcher counts them in). A call
    about to return, or a rank between two calls, breaks it before then."""

    def __init__(self, hold: float = CONFIRM_S):
        self.hold = hold
        self.suspect: tuple[Deadlock, float, object] | None = None  # (proof, since, seen)

    def offer(self, proof: Deadlock | None, seen: object, now: float) -> bool:
        """The proof found now; True once it has held long enough."""
        if proof is None or self.suspect is None or self.suspect[0].calls != proof.calls \
                or self.suspect[2] != seen:
            self.suspect = (proof, now, seen) if proof is not None else None
            return False
        return now >= self.suspect[1] + self.hold

    def due(self) -> float | None:
        """When the proof being confirmed will have held long enough (None: no proof)."""
        return self.suspect[1] + self.hold if self.suspect is not None else None

    def drop(self) -> None:
        self.suspect = None


@dataclass
class _Open:
    event: dict
    waiting: bool  # the rank is inside it: a blocking call, or a wait on an async one
    dones: int = 0


@dataclass
class _Rank:
    entered: dict[tuple, int] = field(default_factory=dict)  # channel or group -> calls
    open: dict[int, _Open] = field(default_factory=dict)
    unprovable: bool = False  # it made a call counting cannot pair: never part of a proof
    finished: bool = False  # it ended: finished, raised or died (``how``)
    how: str = ""
    partial: bytes = b""
    events: int = 0  # call events read (and the end): a snapshot is current while it stands
    flight: dict | None = None  # the Flight Recorder's view (flight.in_flight), if read
    flight_at: int = -1  # ``events`` when it was read
    startup: Startup | None = None  # inside init_process_group: what it gave it


@dataclass
class _History:
    """One group's collectives, as its members made them, for the numbers still open."""

    members: tuple[int, ...]
    # seq -> rank -> (what must agree, the enter event)
    made: dict[int, dict[int, tuple[tuple, dict]]] = field(default_factory=dict)
    parted: int | None = None  # the first number at which two members' calls differ


class WaitFor:
    """Feed each rank's trace bytes as they arrive; ask :meth:`proof` when ranks are quiet."""

    def __init__(self, ranks):
        self.ranks = {rank: _Rank() for rank in ranks}
        self.groups: dict[tuple, _History] = {}  # each group's collectives, rank by rank

    def feed(self, rank: int, chunk: bytes) -> None:
        state = self.ranks[rank]
        lines = (state.partial + chunk).split(b"\n")
        state.partial = lines.pop()
        for line in lines:
            if line.startswith(_EXIT_EVENT):  # a rank's own end, in a trace file
                self._exit(rank, line)
                continue
            if line.startswith(_CALL_EVENTS):
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # a torn line: the rank was killed mid-write
                self._event(state, event)
                if event["ev"] == Ev.ENTER and collective(event):
                    self._history(rank, event)
            elif line.startswith((_INIT_EVENT, _JOINED_EVENT)):  # once or twice a run
                self._startup(state, line)

    def _exit(self, rank: int, line: bytes) -> None:
        """A trace file's last word (written by the rank under torchrun): it ended."""
        try:
            status = json.loads(line).get("status")
        except ValueError:
            return
        self.finished(rank, {"raised": "raised", "exited": "died"}.get(status, "finished"))

    def _startup(self, state: _Rank, line: bytes) -> None:
        """The rank entered init_process_group (what it gave it), or left it."""
        state.events += 1
        if line.startswith(_JOINED_EVENT):
            state.startup = None
            return
        try:
            event = json.loads(line)
        except ValueError:
            return  # a torn line: the rank was killed mid-write
        state.startup = startup_of(event) if isinstance(event, dict) else None

    def _history(self, rank: int, event: dict) -> None:
        """Keep what each member made at each number of the group until every member has
        made the same call there; the first number where two differ stays, with the next."""
        key = _group(event)
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = _History(
                tuple(m for m in event.get("group") or self.ranks if m in self.ranks))
        seq = event["seq"]
        slot = group.made.setdefault(seq, {})
        slot[rank] = (_agreement(event), event)  # written out only if the group parts
        if len({key for key, _ in slot.values()}) > 1:
            group.parted = seq if group.parted is None else min(group.parted, seq)
        elif len(slot) == len(group.members) and (group.parted is None
                                                   or seq > group.parted + 1):
            del group.made[seq]  # every member made the same call: nothing to compare

    def finished(self, rank: int, how: str = "finished") -> None:
        """The rank ended (``how``: finished, raised or died): it will make no more calls."""
        self.ranks[rank].finished = True
        self.ranks[rank].how = how
        self.ranks[rank].events += 1

    def flight(self, rank: int, view: dict) -> None:
        """What the Flight Recorder says of ``rank`` now. The caller feeds every trace line
        the rank wrote until the answer first (and drops the view if any was a call event),
        so the view belongs to the call the rank is in."""
        state = self.ranks[rank]
        state.flight, state.flight_at = view, state.events

    def needs_flight(self) -> bool:
        """Is a rank in a collective that no current Flight Recorder view places, or in no
        traced call at all (it may be inside one torch made itself, DDP's from C++: only
        its recorder can say, and two such ranks at one number with collectives that
        cannot pair are a proof)? The watch asks at most once a second while all is quiet."""
        blocked = self.blocked()
        if any(collective(call) and self._view(rank) is None for rank, call in blocked.items()):
            return True
        return any(not state.finished and not state.unprovable and rank not in blocked
                   and (state.flight is None or state.flight_at != state.events)
                   for rank, state in self.ranks.items())

    def _view(self, rank: int) -> dict | None:
        """The rank's Flight Recorder view, while it still holds: taken since the rank's
        last call event, and the rank is blocked in a call or has ended (a rank that runs
        may have enqueued more since)."""
        state = self.ranks[rank]
        if state.flight is None or state.flight_at != state.events:
            return None
        inside = any(c.waiting for c in state.open.values())
        return state.flight if (inside or state.finished) and not state.unprovable else None

    def _place(self, rank: int, call: dict) -> int | None:
        """The Flight Recorder's number of the collective ``rank`` waits in: known when the
        rank's open traced collectives on the group are its collectives in flight there,
        one for one and op for op (nothing untraced among them, no call gloo splits)."""
        view = self._view(rank)
        if view is None or not collective(call):
            return None
        mine = view.get(call.get("pg"))
        if not mine:
            return None
        opened = sorted((c.event for c in self.ranks[rank].open.values()
                         if collective(c.event) and c.event.get("pg") == call.get("pg")),
                        key=lambda e: e["id"])
        flying = [mine["ops"].get(k) for k in range(mine["completed"] + 1, mine["enqueued"] + 1)]
        if [_family(e["op"]) for e in opened] != flying:
            return None
        return mine["completed"] + 1 + [e["id"] for e in opened].index(call["id"])

    def _event(self, state: _Rank, event: dict) -> None:
        state.events += 1
        kind = event["ev"]
        if kind == Ev.ENTER:
            if event.get("main") is False or \
                    (event["op"] in RECEIVES and event.get("peer") is None):
                state.unprovable = True
            for key, seq in _channels(event):
                state.entered[key] = max(state.entered.get(key, 0), seq + 1)
            state.open[event["id"]] = _Open(event, waiting=not event.get("async_op"))
            return
        call = state.open.get(event.get("id", -1))
        if call is None:
            return
        if kind == Ev.WAIT:
            call.waiting = True
        elif kind == Ev.ERROR or not call.event.get("async_op"):
            del state.open[event["id"]]
        else:  # an async call's works each report their own wait's end
            call.waiting = False
            call.dones += 1
            if call.dones >= max(1, len(call.event.get("peers") or ())):
                del state.open[event["id"]]

    def blocked(self) -> dict[int, dict]:
        """rank -> the call it is inside now, for ranks that may take part in a proof."""
        found = {}
        for rank, state in self.ranks.items():
            if state.finished or state.unprovable:
                continue
            inside = [c.event for c in state.open.values() if c.waiting]
            if inside:
                found[rank] = max(inside, key=lambda e: e["id"])
        return found

    def waits(self, rank: int, call: dict) -> set[int] | None:
        """The ranks ``call`` waits for; None when that cannot be known (any-source)."""
        group = _group(call)
        if call["op"] == BATCH:
            return {peer for way, peer, seq, *tag in call.get("peers", ())
                    if not self._matched(rank, way, peer, seq, group, tag)}
        if is_point_to_point(call["op"]):
            if call.get("peer") is None:
                return None
            return ({call["peer"]} if not self._matched(rank, direction(call["op"]), call["peer"],
                                                        call["seq"], group, [call.get("tag")])
                    else set())
        key, place = ("collective", group), self._place(rank, call)
        found = set()
        for member in call["group"] or self.ranks:
            if member == rank or member not in self.ranks:
                continue
            view = self._view(member) if place is not None else None
            if view is not None:  # has it enqueued the collective at that number?
                if view.get(call.get("pg"), {}).get("enqueued", 0) < place:
                    found.add(member)
            elif self.ranks[member].entered.get(key, 0) <= call["seq"]:
                found.add(member)
        return found

    def _matched(self, rank: int, way: str, peer: int, seq: int, group: tuple,
                 tag: list) -> bool:
        other = self.ranks.get(peer)
        if other is None:
            return False
        opposite = "recv" if way == "send" else "send"
        return other.entered.get((opposite, rank, group, _tag(tag)), 0) > seq

    def proof(self) -> Deadlock | None:
        blocked = self.blocked()
        known = {rank: self.waits(rank, call) for rank, call in blocked.items()}
        # a wait nobody can know (a receive from any source) takes no part in a proof
        waits = {rank: w for rank, w in known.items() if w is not None}
        mismatch = self._mismatch(blocked)
        ended = {rank for rank, state in self.ranks.items() if state.finished}
        stuck = set(waits) | ended
        changed = True
        while changed:  # drop every rank none of whose awaited ranks is stuck
            changed = False
            for rank in sorted(stuck - ended):
                if rank not in mismatch and not (waits[rank] & stuck):
                    stuck.discard(rank)
                    changed = True
        stuck -= ended
        if not stuck:
            return self._flight_mismatch(blocked) or self._parted(blocked, known) or \
                self._never_forms()
        calls = tuple((r, blocked[r]["id"]) for r in sorted(stuck))
        cycle = cycle_of({r: waits[r] & stuck for r in stuck if r not in mismatch})
        if cycle:
            ring = " -> ".join(map(str, cycle + [cycle[0]]))
            return Deadlock("cycle", tuple(sorted(stuck)), calls,
                            f"ranks {ring} each wait for the next: "
                            + "; ".join(f"rank {r} in {_name(blocked[r])}" for r in cycle))
        if mismatch:
            ranks = sorted(set(mismatch) & stuck)
            return Deadlock("mismatch", tuple(sorted(stuck)), calls,
                            "collectives that cannot pair at one point of their group: "
                            + "; ".join(f"rank {r} in {_name(blocked[r])}"
                                                  + mismatch[r] for r in ranks))
        gone = {p: self.ranks[p].how for r in stuck for p in waits[r] & ended}
        inside: dict[str, list[int]] = {}
        for rank in sorted(stuck):
            inside.setdefault(_name(blocked[rank]), []).append(rank)
        return Deadlock("exited", tuple(sorted(stuck)), calls,
                        " and ".join(grouped(gone, " ")) + " while " + "; ".join(
                            f"{ranks_phrase(ranks)} wait{'s' * (len(ranks) == 1)} in {call}"
                            for call, ranks in inside.items()))

    def _never_forms(self) -> Deadlock | None:
        """Every rank of the job inside init_process_group (or ended), for a group their
        start-ups prove can never form. A rank not yet in it may still come: no proof."""
        waiting = {rank: state.startup for rank, state in self.ranks.items()
                   if state.startup is not None and not state.finished}
        if not waiting or any(state.startup is None and not state.finished
                              for state in self.ranks.values()):
            return None
        found = never_forms(waiting, len(self.ranks))
        if found is None:
            return None
        return Deadlock("startup", tuple(sorted(waiting)),
                        tuple((rank, -1) for rank in sorted(waiting)), found.symptom)

    def _parted(self, blocked: dict[int, dict], waits: dict[int, set[int] | None]
                ) -> Deadlock | None:
        """Every rank blocked (or finished) after a group's collectives parted: a number
        means something else on each side of a parting, so a collective of that group
        after it can never be trusted to pair, and counting no longer tells who waits.
        Proven when every rank that has not finished is blocked either in such a
        collective (``_past_parting``) or in a call that, counted, still waits for
        someone: nobody computes, and nothing is known to be about to return. (A job
        whose calls parted but still pair, SUM against MAX, keeps making calls, and a
        proof must hold unchanged to stop it.)"""
        parted = {key: g for key, g in self.groups.items() if g.parted is not None}
        if not parted or not blocked:
            return None
        for rank, state in self.ranks.items():
            if state.finished:
                continue
            call = blocked.get(rank)
            if call is None:
                return None  # it computes, or made a call counting cannot pair
            untrusted = collective(call) and self._past_parting(_group(call), call["seq"])
            if not untrusted and not waits.get(rank):
                return None  # its call has all it waits for: it may be about to return
        key, group = min(parted.items(), key=lambda item: min(
            event.get("t", 0.0) for _, event in item[1].made[item[1].parted or 0].values()))
        seq = group.parted or 0
        parting = parting_at(key[0] or tuple(self.ranks), key[1], seq,
                             {r: _made(e) for r, (_, e) in group.made[seq].items()},
                             {r: _made(e) for r, (_, e) in group.made.get(seq + 1, {}).items()})
        ranks = tuple(sorted(blocked))
        said = parting.sentence(len(group.members)) if parting else ""
        return Deadlock("parted", ranks, tuple((r, blocked[r]["id"]) for r in ranks),
                        f"the ranks' {parting.where_said() if parting else 'collectives'} "
                        f"parted ({said}), and every rank is blocked since")

    def _past_parting(self, key: tuple, seq: int) -> bool:
        """Is a collective at ``seq`` of this group one no member can be trusted to pair?
        After the number where the group parted, none is; at that number, only once a
        member has gone past it or finished (while every member is still inside it, gloo
        pairs their calls, silently or with an error: SUM against MAX, 4 against 5)."""
        group = self.groups.get(key)
        if group is None or group.parted is None or seq < group.parted:
            return False
        return seq > group.parted or any(
            self.ranks[m].finished
            or self.ranks[m].entered.get(("collective", key), 0) > group.parted + 1
            for m in group.members)

    def _flight_mismatch(self, blocked: dict[int, dict]) -> Deadlock | None:
        """Ranks whose Flight Recorders each hold a collective in flight at the same number
        of a group, of kinds that cannot pair: neither can ever complete, whether or not
        the rank waits on it yet (DDP waits on its all-reduce from C++, where the tracer
        does not see it wait). The traced calls cannot place them when gloo let some of a
        mismatched run's broadcasts complete and not others (ZeroRedundancyOptimizer with a
        skipped head, under load), so this is read from the recorders alone. Each view was
        taken with no call event around it, and an op once enqueued at a number keeps it."""
        slots: dict[tuple, dict[int, str]] = {}
        for rank, state in self.ranks.items():
            if state.flight is None or state.flight_at != state.events or state.unprovable \
                    or state.finished:
                continue
            for pg, view in state.flight.items():
                for number, op in (view or {}).get("ops", {}).items():
                    slots.setdefault((pg or "", int(number)), {})[rank] = op
        for (pg, number), ops in sorted(slots.items()):
            if len({_family(op) for op in ops.values()}) < 2:
                continue
            ranks = tuple(sorted(ops))
            where = f"collective #{number} of {pg or 'the default group'}"
            return Deadlock("mismatch", ranks,
                            tuple((r, blocked[r]["id"]) for r in ranks if r in blocked),
                            f"collectives that cannot pair at one point of their group, both "
                            f"still in flight ({where}, by torch's Flight Recorder): "
                            + "; ".join(f"rank {r} has {ops[r]}" for r in ranks))
        return None

    def _mismatch(self, blocked: dict[int, dict]) -> dict[int, str]:
        """rank -> "" for ranks inside the same traced collective number of a group in calls
        that cannot pair (see _FAMILY), every member inside it, unless the Flight Recorder
        places all of them; rank -> what a member put there instead, where the Flight
        Recorder shows one at its call's number."""
        at: dict[tuple, dict[int, dict]] = {}
        found: dict[int, str] = {}
        for rank, call in blocked.items():
            if not collective(call):
                continue
            at.setdefault((_group(call), call["seq"]), {})[rank] = call
            place = self._place(rank, call)
            for member in (call["group"] or self.ranks) if place is not None else ():
                view = self.ranks[member].flight if member in self.ranks else None
                theirs = ((view or {}).get(call.get("pg")) or {}).get("ops", {}).get(place)
                if member != rank and theirs and theirs != _family(call["op"]):
                    found[rank] = (f" (collective #{place} of its group in torch's Flight "
                                   f"Recorder, where rank {member} has {theirs})")
        for ((members, _), _), calls in at.items():
            members = set(members or self.ranks)
            placed = all(self._place(r, c) is not None for r, c in calls.items())
            if members <= set(calls) and not placed \
                    and len({_signature(c) for c in calls.values()}) > 1:
                found.update((r, found.get(r, "")) for r in calls)
        return found


def _channels(event: dict) -> list[tuple[tuple, int]]:
    """The channels or group a call counts on, with its number there."""
    group = _group(event)
    if event["op"] == BATCH:
        return [((d, p, group, _tag(t)), s) for d, p, s, *t in event.get("peers", ())]
    if is_point_to_point(event["op"]):
        return [((direction(event["op"]), event.get("peer"), group, _tag([event.get("tag")])),
                 event["seq"])]
    return [(("collective", group), event["seq"])]


def _tag(found: list) -> int:
    """A send's or receive's tag: the first of ``found`` (what follows a batch op's number,
    or a call's ``tag``), 0 when absent."""
    return (found[0] if found else 0) or 0


def collective(call: dict) -> bool:
    """Is the call (an enter event) a collective, not a send, receive or batch of them?"""
    return is_collective(call["op"])


def _group(call: dict) -> tuple:
    """A call's group: its ranks, and its name unless it is the default group."""
    return tuple(call.get("group") or ()), call.get("pg")


def _family(op: str) -> str:
    """The op as gloo runs it, and as the Flight Recorder names it."""
    return _FAMILY.get(op, op)


def _signature(call: dict) -> tuple:
    """What must agree for a collective to pair up at all: its algorithm and its root."""
    return _family(call["op"]), call.get("peer")


def _agreement(event: dict) -> tuple:
    return agreement(event["op"], event.get("peer"), event.get("shapes") or (),
                     event.get("dtype") or "", event.get("reduce_op"))


def _made(event: dict) -> Made:
    """What a rank made, from its enter event, as sequences.py compares it."""
    return Made(_agreement(event),
                _name({**event, "where": relative_line(event.get("where") or "")}),
                event.get("where") or "", event.get("t", 0.0))


def _name(call: dict) -> str:
    """An enter event as every report writes a call."""
    return describe_call(call["op"], call.get("peer"), call["seq"], call.get("shapes") or (),
                         call.get("dtype") or "", call.get("reduce_op"), call.get("pg"),
                         call.get("where") or "")


def cycle_of(edges: dict[int, set[int]]) -> list[int] | None:
    """The first cycle found following wait-for edges, as a list of ranks (the hang check
    and check-collective use it too)."""
    for start in sorted(edges):
        path, node = [start], start
        while True:
            following = sorted(edges.get(node, ()))
            if not following:
                break
            node = following[0]
            if node in path:
                return path[path.index(node):]
            path.append(node)
    return None


# -- the same graph after the fact, from a RunRecord -----------------------------------


def blocking_call(rank: RankRecord) -> Call | None:
    """The call a stopped rank is inside: the last one it entered and never left."""
    blocking = [c for c in rank.evidence.calls if c.blocking]
    return blocking[-1] if blocking else None


def same_collective(a: Call, b: Call) -> bool:
    """Are these one collective of one group (same group, same number), on two ranks?"""
    return is_collective(a.op) and (a.group, a.pg, a.seq) == (b.group, b.pg, b.seq)


def waits_for(call: Call, record: RunRecord, joined: dict[tuple, set[int]] | None = None
              ) -> set[int]:
    """The ranks a blocked ``call`` waits for: its peers, or the members of its group that
    never entered the same collective (``joined``: joined_by(record), when asked for
    many calls)."""
    if call.op == BATCH:
        return {peer for _, peer in call.peers}
    if is_point_to_point(call.op):
        return {call.peer} if call.peer is not None else set()
    entered = (joined if joined is not None else joined_by(record)).get(
        (call.group, call.pg, call.seq), set())
    return set(call.group or range(len(record.ranks))) - entered


def joined_by(record: RunRecord) -> dict[tuple, set[int]]:
    """(group, name, number) -> the ranks that entered that collective: one pass over the
    calls, so that asking for every blocked rank of 16,384 is not a pass each."""
    found: dict[tuple, set[int]] = {}
    for rank in record.ranks:
        for call in rank.evidence.calls:
            if is_collective(call.op):
                found.setdefault((call.group, call.pg, call.seq), set()).add(rank.rank)
    return found


def wait_edges(record: RunRecord) -> dict[int, set[int]]:
    """Whom each stopped rank waits for, from the call it is blocked in: the wait-for
    graph a finished run's hang is judged on, and the one the pictures draw."""
    stopped = [r for r in record.ranks if r.end.status in STOPPED]
    blocked = {r.rank: blocking_call(r) for r in stopped}
    joined = joined_by(record)
    shared: dict[tuple, set[int]] = {}  # one set per collective, however many wait in it
    edges = {}
    for rank, call in blocked.items():
        if call is None:
            continue
        if is_collective(call.op) and call.op != BATCH:
            key = (call.group, call.pg, call.seq)
            if key not in shared:
                shared[key] = waits_for(call, record, joined)
            edges[rank] = shared[key]
        else:
            edges[rank] = waits_for(call, record, joined)
    return edges
