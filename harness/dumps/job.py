"""The ranks' dumps as one job's evidence: each rank's end and calls, in the vocabulary the
checks already judge a hang by (analysis/waitfor.py, analysis/sequences.py), so a dump from a
cluster gets the same causes, report, JSON and pictures as a run distdoctor traced.

What each rank's dump says becomes: its operations not completed, as calls it is inside
(the oldest blocking, the later ones enqueued behind it), and its recorder's history as
``RankEnd.recorded``, the sequence the hang check compares across ranks. Histories are
handed on from the first number at which any two ranks of a group differ (everything
before it is the same on every rank: it cannot be where they part), with one entry kept
for each older line a rank ran, which the two-sided verdict asks about. At 16,384 ranks
that is the difference between a few entries and 2,000 per rank.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from distdoctor.analysis.sequences import agreement
from distdoctor.dumps.read import RankRead
from distdoctor.dumps.schema import DEFAULT_DESC, Entry, Group
from distdoctor.models import Call, RankEnd, RankRecord, RunRecord, RunSpec, deadlines
from distdoctor.models.calls import describe_call, grouped, ranks_phrase, relative_line
from distdoctor.models.evidence import Evidence
from distdoctor.models.record import Recorded
from distdoctor.models.strategies import USER_SCRIPT

NO_DUMP = ("no Flight Recorder dump: it may have exited or died before the others hung, "
           "or its node's files were not collected")


@dataclass(frozen=True)
class Dumps:
    """Every rank's read, the histories they share (by signature), and what could not be
    read, one line each."""

    reads: dict[int, RankRead]
    histories: dict[bytes, tuple[Entry, ...]]
    members: dict[bytes, tuple[int, ...] | None]  # each group's global ranks, by signature
    notes: tuple[str, ...]


@dataclass(frozen=True)
class _Pg:
    """One process group as the job's dumps describe it."""

    name: str
    label: str | None  # as reports name it: None for the default group
    members: tuple[int, ...]  # global ranks, in group-rank order


def world_of(dumps: Dumps) -> int:
    """The job's size: its default group's, where a dump's pg_config gives it; else the
    highest rank seen."""
    defaults = {g.members for read in dumps.reads.values() for _, g in read.groups
                if g.desc in (DEFAULT_DESC, "") or g.name in ("0", "")}
    sizes = [len(m) for s in defaults if (m := dumps.members.get(s))]
    seen = [max(dumps.reads, default=-1) + 1] + [max(m) + 1 for m in dumps.members.values()
                                                 if m]
    return max(sizes + seen, default=0)


def record_of(dumps: Dumps) -> tuple[RunRecord, tuple[str, ...], tuple[str, ...]]:
    """The RunRecord the checks judge; what the dumps could not tell (ranks without a
    readable dump: the evidence is partial); and what they never hold (entries dropped
    by a wrapped ring buffer, gloo's sends and receives)."""
    world = world_of(dumps)
    groups = _groups(dumps, world)
    notes = list(dumps.notes)
    missing = [rank for rank in range(world) if rank not in dumps.reads]
    if missing:
        notes.append(f"{ranks_phrase(missing)}: {NO_DUMP}")
    starts = _windows(dumps)
    flying = _flying(dumps)
    held: dict[tuple, _Held] = {}
    built: list[tuple[int, RankRead | None, tuple[Call, ...], tuple[Recorded, ...], str]] = []
    for rank in range(world):
        read = dumps.reads.get(rank)
        if read is None:
            built.append((rank, None, (), (), ""))
            continue
        built.append((rank, read, *_rank_calls(read, dumps, groups, starts, flying, held)))
    waiting = _waiting(built)
    limits_found: tuple[str, ...] = ()
    if not waiting and _alike(built) and any(c.blocking for _, _, made, _, _ in built
                                              for c in made):
        limits_found = (_inside(built),)
    ranks = []
    for rank, read, calls, recorded, last in built:
        if read is None:
            # not a crash the dumps show: gone, or never written; peers waiting for it
            # point at it as at a rank that left
            end = RankEnd(rank, "finished", at=0.0, error=NO_DUMP)
            ranks.append(RankRecord(rank, end, Evidence(rank=rank)))
            continue
        if not waiting:  # nobody waits for anybody: a job dumped as it ran, or done
            end = RankEnd(rank, "finished", recorded=recorded)
            calls = tuple(c for c in calls if not c.blocking)
        elif any(c.blocking for c in calls):
            end = RankEnd(rank, "hung", at=0.0, error=f"its Flight Recorder dump "
                          f"({read.path}) holds operations not completed", recorded=recorded)
        else:
            end = RankEnd(rank, "hung", at=0.0, recorded=recorded, error=(
                "every operation its Flight Recorder holds completed: it was outside any "
                "collective when dumped" + (f" (its last: {last})" if last else "")))
        ranks.append(RankRecord(rank, end, Evidence(rank=rank, calls=calls)))
    spec = RunSpec(strategy=USER_SCRIPT, world_size=world, num_samples=max(64, 8 * world),
                   deadline=deadlines.DUMPED_JOB_S)
    return RunRecord(spec=spec, ranks=tuple(ranks), wall_s=0.0), tuple(notes), \
        limits(dumps) + limits_found


def _waiting(built: list) -> bool:
    """Does some rank wait for another: a send or receive in flight, or a collective in
    flight that some member of its group never reached (in flight or completed)? Where
    every rank inside a collective finds the whole group there, the dumps show a job
    caught mid-collective, or ranks inside different calls at one number (which the
    histories' comparison names), not a rank it waits for."""
    joined: dict[tuple, set[int]] = {}
    for rank, read, calls, _, _ in built:
        for call in calls:
            joined.setdefault((call.pg, call.seq), set()).add(rank)
    judged: set[tuple] = set()  # each collective once, however many ranks wait in it
    for rank, read, calls, _, _ in built:
        for call in calls:
            if not call.blocking or (call.pg, call.seq) in judged:
                continue
            if call.peer is not None or call.op in ("send", "recv"):
                return True
            judged.add((call.pg, call.seq))
            if len(joined.get((call.pg, call.seq), ())) < len(set(call.group)):
                return True
    return False


def _alike(built: list) -> bool:
    """Did every rank with a call at each number of a group (in flight, queued, or
    completed alike) make the same call there?"""
    made: dict[tuple, set[tuple]] = {}
    for _, _, calls, _, _ in built:
        for call in calls:
            made.setdefault((call.pg, call.seq), set()).add(_agreed(call))
    return all(len(keys) == 1 for keys in made.values())


def _agreed(call: Call) -> tuple:
    return agreement(call.op, call.peer, call.shapes, call.dtype, call.reduce_op)


def _inside(built: list) -> str:
    """The note for ranks inside collectives their whole groups had joined."""
    inside = {rank: call.describe(relative=True) for rank, _, calls, _, _ in built
              for call in calls if call.blocking}
    return ("; ".join(grouped(inside, " inside ")) + ": every member of its group had "
            "joined it: a collective in progress when the dumps were taken, or one stuck in "
            "the network or a device; the dumps cannot tell which, and no rank waits for "
            "another")


def limits(dumps: Dumps) -> tuple[str, ...]:
    """What the dumps cannot hold, whoever wrote them: one line each."""
    found = []
    wrapped: dict[int, int] = {r.rank: r.oldest_record for r in dumps.reads.values()
                               if r.oldest_record > 0}
    if wrapped:
        found.append(
            f"{ranks_phrase(wrapped)}: the recorder's ring buffer wrapped (the oldest entry "
            f"kept is record #{min(wrapped.values())}"
            + (f" to #{max(wrapped.values())}" if len(set(wrapped.values())) > 1 else "")
            + "): older operations are gone, and ranks are compared on the numbers all "
              "of them still hold")
    empty = [r.rank for r in dumps.reads.values() if r.entries == 0]
    if empty:
        found.append(f"{ranks_phrase(empty)}: the dump holds no operations (written before "
                     f"the first collective, or with the recorder off: TORCH_FR_BUFFER_SIZE "
                     f"must be above 0)")
    bare = [r.rank for r in dumps.reads.values() if r.entries and not r.framed]
    if bare:
        found.append(f"{ranks_phrase(bare)}: the dump holds no Python frames (torch's JSON "
                     f"dumps never do; its pickles do): the lines that made each call are "
                     f"not known")
    gloo = [r.rank for r in dumps.reads.values() if r.backend == "gloo"]
    if gloo:
        found.append(f"{ranks_phrase(gloo)}: gloo's recorder holds no sends or receives: "
                     f"point-to-point calls are not in these dumps")
    versions = {r.version for r in dumps.reads.values()}
    if len(versions) > 1:
        found.append(f"the dumps are of {len(versions)} schema versions "
                     f"({', '.join(sorted(versions))}): written by different torch builds")
    return tuple(found)


def _groups(dumps: Dumps, world: int) -> dict[str, _Pg]:
    """Every group named in the entries: its members from some rank's pg_config (gloo
    keys its default group "", described "default_pg" in the entries), else the ranks
    whose dumps hold it."""
    config: dict[str, Group] = {}
    holders: dict[str, list[int]] = {}
    descs: dict[str, str] = {}
    for rank, read in sorted(dumps.reads.items()):
        for key, group in read.groups:
            config.setdefault(group.name, group)
            config.setdefault(key, group)
        for name, _ in read.histories:
            holders.setdefault(name, []).append(rank)
        descs.update(read.descs)
    found = {}
    for name, held_by in holders.items():
        default = descs.get(name) == DEFAULT_DESC or (name == "0" and not descs.get(name))
        known = config.get(name)
        listed = dumps.members.get(known.members) if known is not None else None
        members = tuple(range(world)) if default else listed or tuple(held_by)
        found[name] = _Pg(name, None if default else name, members)
    return found


def _windows(dumps: Dumps) -> dict[str, int]:
    """Per group, the first collective number handed on: one before the first number at
    which two of its histories differ, else the oldest in flight on any rank, else the
    newest. One pass over the ranks; groups of one shape (every tensor-parallel group of
    a job) share their histories, and the comparison is made once per set of them."""
    signatures: dict[str, set[bytes]] = {}
    flying: dict[str, int] = {}
    for read in dumps.reads.values():
        for name, history in read.histories:
            signatures.setdefault(name, set()).add(history.signature)
            if history.in_flight:
                seq = dumps.histories[history.signature][history.in_flight[0]].seq
                flying[name] = min(seq, flying.get(name, seq))
    parted: dict[frozenset[bytes], int | None] = {}
    found = {}
    for name, held in signatures.items():
        key = frozenset(held)
        if key not in parted:
            parted[key] = _first_difference([dumps.histories[s] for s in held])
        first = parted[key]
        newest = max((e.seq for s in held for e in dumps.histories[s][-1:]), default=0)
        found[name] = min([newest] + ([first - 1] if first is not None else [])
                          + ([flying[name]] if name in flying else []))
    return found


def _first_difference(histories: list[tuple[Entry, ...]]) -> int | None:
    """The first collective number, of those every history holds, at which two differ
    (kind, sizes, dtype or line); None when none does."""
    by_number = [{e.seq: e for e in h if not e.p2p} for h in histories]
    if len(by_number) < 2:
        return None
    common = sorted(set.intersection(*(set(h) for h in by_number)))
    return next((seq for seq in common
                 if len({(h[seq].op, h[seq].sizes, h[seq].dtype, h[seq].where)
                         for h in by_number}) > 1), None)


def _flying(dumps: Dumps) -> dict[tuple[str, int], set[tuple]]:
    """(group, number) -> what the ranks with that collective in flight made there."""
    found: dict[tuple[str, int], set[tuple]] = {}
    for read in dumps.reads.values():
        for name, history in read.histories:
            entries = dumps.histories[history.signature]
            for position in history.in_flight:
                entry = entries[position]
                if not entry.p2p:
                    found.setdefault((name, entry.seq), set()).add(_key(entry))
    return found


def _key(entry: Entry) -> tuple:
    """What every member's call at one number must share (the checks' own definition)."""
    return agreement(entry.op, None, entry.sizes, entry.dtype, None)


@dataclass(frozen=True)
class _Held:
    """What every rank of one history on one group hands on: its collectives from the
    window on and one of each older line, as Recorded; the positions from the window on."""

    recorded: tuple[Recorded, ...]
    window: tuple[int, ...]


def _held(entries: tuple[Entry, ...], pg: _Pg, start: int) -> _Held:
    older: dict[str, Entry] = {}
    recorded: list[Recorded] = []
    window: list[int] = []
    for position, entry in enumerate(entries):
        if entry.p2p:
            continue
        if entry.seq < start:
            older.setdefault(entry.where, entry)
            continue
        recorded.append(Recorded(pg.label, entry.seq, entry.op, entry.sizes, entry.dtype,
                                 entry.where))
        window.append(position)
    lines = [Recorded(pg.label, e.seq, e.op, e.sizes, e.dtype, e.where)
             for e in older.values() if e.where]
    return _Held(tuple(lines + recorded), tuple(window))


def _rank_calls(read: RankRead, dumps: Dumps, groups: dict[str, _Pg], starts: dict[str, int],
                flying: dict[tuple[str, int], set[tuple]], held: dict[tuple, _Held]
                ) -> tuple[tuple[Call, ...], tuple[Recorded, ...], str]:
    """The rank's calls: its operations in flight (the oldest, by record id, the one it
    waits in; the later ones enqueued behind it), and the completed collectives that
    another rank has in flight, as made alike (it joined them: where they differ, the
    histories say so); its recorder's history for the checks (shared by every rank of
    the same history), and its newest operation described."""
    calls: list[tuple[int, Call]] = []
    recorded: tuple[Recorded, ...] = ()
    newest: tuple[int, str] = (-2, "")
    for name, history in read.histories:
        entries = dumps.histories[history.signature]
        pg = groups[name]
        key = (history.signature, name)
        if key not in held:
            held[key] = _held(entries, pg, starts[name])
        recorded += held[key].recorded
        in_flight = dict(zip(history.in_flight, history.in_flight_records))
        for position, record_id in in_flight.items():
            calls.append((record_id, _call(read.rank, entries[position], pg, True)))
        for position in held[key].window:
            entry = entries[position]
            if position not in in_flight and _key(entry) in flying.get((name, entry.seq), ()):
                calls.append((-1, _call(read.rank, entry, pg, False)))
        if entries and history.last_record > newest[0]:
            tail = entries[-1]
            newest = (history.last_record, describe_call(
                tail.op, None, tail.seq, tail.sizes, tail.dtype, None, pg.label,
                relative_line(tail.where) if tail.where else ""))
    ordered = [call for _, call in sorted(calls, key=lambda rc: rc[0])]
    waiting = next((c for c in ordered if c.completed is None), None)
    return tuple(c if c is waiting or c.completed is not None else _queued(c)
                 for c in ordered), recorded, newest[1]


def _call(rank: int, entry: Entry, pg: _Pg, in_flight: bool) -> Call:
    members = pg.members
    peer = members[entry.peer] if entry.peer is not None and entry.peer < len(members) \
        else entry.peer
    return Call(id=0, rank=rank, op=entry.op, seq=entry.seq, group=members, peer=peer,
                peers=(), shapes=entry.sizes, dtype=entry.dtype, reduce_op=None,
                where=entry.where, async_op=False, entered=float(entry.seq),
                completed=None if in_flight else float(entry.seq), pg=pg.label)


def _queued(call: Call) -> Call:
    """An operation enqueued behind the one the rank waits in: made, not waited on."""
    return replace(call, async_op=True)
