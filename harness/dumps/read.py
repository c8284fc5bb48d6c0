"""One rank's dump file, read as plain data and folded into what the checks need.

A cluster's dumps are thousands of files of 2000 entries each, nearly all alike: ranks
made the same calls in the same order on groups of the same shape. So a file's entries
are reduced to a signature (a hash of every field the checks compare and of which group,
by order of appearance, each entry is on; the groups' names aside), and only the first
file of each signature is split by group and built into entries; the others share them.
What differs from rank to rank, its groups' names and how far it got (its entries in
flight), is read per rank.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import re
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path

from distdoctor.dumps.schema import (
    DONE_STATES,
    Entry,
    Group,
    backend_of,
    entry_of,
    groups_of,
    pg_of,
    ranks_of,
    seq_of,
)
from distdoctor.models.plaindata import load_plain

# the fields of an entry the checks compare, in the names of every schema version
_COMPARED = ("collective_seq_id", "seq_id", "p2p_seq_id", "profiling_name", "input_sizes",
             "input_dtypes", "is_p2p", "frames")


class NotADump(ValueError):
    """The file is plain data, but not a Flight Recorder dump."""


@dataclass(frozen=True)
class GroupHistory:
    """One rank's entries on one group: which history (``signature``; its entries are
    shared by every rank of that signature) and which of them had not completed."""

    signature: bytes
    in_flight: tuple[int, ...]  # positions in the history, oldest first
    in_flight_records: tuple[int, ...]  # their record ids (order across the rank's groups)
    last_record: int  # the record id of its newest entry


@dataclass(frozen=True)
class RankRead:
    """What one rank's file holds, in the dump vocabulary."""

    rank: int
    path: str
    version: str
    backend: str  # "nccl", "gloo", ... from the entries' profiling names
    groups: tuple[tuple[str, Group], ...]  # its pg_config
    descs: tuple[tuple[str, str], ...]  # group name -> description, from its entries
    histories: tuple[tuple[str, GroupHistory], ...]  # group name -> its history there
    oldest_record: int  # the first record id it still holds (> 0: the ring buffer wrapped)
    entries: int
    framed: bool  # its entries hold Python frames (torch's JSON dumps never do)


def load(path: Path) -> object:
    """A dump file's plain data: JSON, or a pickle through the plain-data unpickler.
    NotPlainData when the pickle names a class or function (nothing of it runs);
    ValueError when it is cut short or neither."""
    with open(path, "rb") as file:
        head = file.peek(1)[:1]
        if head in (b"{", b"["):
            try:
                return json.load(file)
            except (ValueError, RecursionError) as exc:
                raise ValueError(f"not readable JSON ({exc})") from None
        return load_plain(file)


@dataclass(frozen=True)
class Shared:
    """What ranks share, by signature: each history's entries and each group's ranks,
    sent the first time a reader meets them."""

    histories: dict[bytes, tuple[Entry, ...]]
    members: dict[bytes, tuple[int, ...] | None]


@dataclass(frozen=True)
class _Program:
    """What every rank whose file has one signature shares: the signature of its history
    on each of its groups (in the order the groups first appear) and, per entry, its
    group's index and its position there."""

    histories: tuple[bytes, ...]
    places: tuple[tuple[int, int], ...]


def read(path: Path, rank: int, known: dict[bytes, object] | None = None
         ) -> tuple[RankRead, Shared]:
    """The rank's read, and what it holds that is not in ``known`` (which it adds to).
    NotADump, NotPlainData or ValueError when the file cannot be read as a dump.

    Ranks of one job made the same calls in the same order on groups of the same shape,
    whatever each group is called: a file's entries, their groups' names aside, hash to
    a signature, and only the first file of each signature is split by group and built
    into entries. Per rank there is C-level work over its entries and a walk back from
    its newest entries to the last completed one of each group."""
    dump = load(path)
    if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list):
        raise NotADump("plain data, but not a Flight Recorder dump (no list of entries)")
    entries = dump["entries"]
    try:
        backend = backend_of(entries[0]["profiling_name"]) if entries else ""
        list(map(itemgetter("profiling_name"), entries))
    except (KeyError, TypeError, IndexError):
        raise NotADump("some of its entries are not of torch's shape (no "
                       "profiling_name)") from None
    known = {} if known is None else known
    shared = Shared({}, {})
    keys = _group_keys(entries)
    order = list(dict.fromkeys(keys))
    slots = list(map({k: i for i, k in enumerate(order)}.__getitem__, keys))
    signature = _signature(entries, slots)
    program = known.get(signature)
    if not isinstance(program, _Program):
        program = _program(entries, slots, len(order), signature, shared)
        known[signature] = program
    flying = _in_flight(entries, slots, len(order), _completed(dump))
    lasts: dict[int, int] = {}
    for index, slot in enumerate(slots):
        lasts[slot] = index
    histories = []
    for slot, key in enumerate(order):
        mine = [i for i in flying if slots[i] == slot]
        histories.append((key[0], GroupHistory(
            program.histories[slot], tuple(program.places[i][1] for i in mine),
            tuple(_record_id(entries[i]) for i in mine), _record_id(entries[lasts[slot]]))))
    groups = []
    for config_key, (name, desc, written) in groups_of(dump).items():
        members = _members_signature(written)
        if members and members not in known:
            known[members] = True
            shared.members[members] = ranks_of(written)
        groups.append((config_key, Group(name, desc, members)))
    oldest = entries[0].get("record_id", 0) if entries else 0
    rank_hint = dump.get("rank")
    read_ = RankRead(
        rank=rank_hint if isinstance(rank_hint, int) and rank_hint >= 0 else rank,
        path=str(path), version=str(dump.get("version", "")), backend=backend,
        groups=tuple(groups), descs=tuple((k[0], k[1]) for k in order),
        histories=tuple(histories), oldest_record=oldest if isinstance(oldest, int) else 0,
        entries=len(entries), framed=bool(entries) and bool(entries[-1].get("frames")))
    return read_, shared


def _group_keys(entries: list[dict]) -> list[tuple[str, str]]:
    """Each entry's (group name, description), in C where torch wrote them as tuples (its
    pickles do); by hand where not (JSON's lists, a version without process_group), and
    where one name comes with two descriptions."""
    try:
        keys = list(map(itemgetter("process_group"), entries))
        distinct = dict.fromkeys(keys)  # TypeError for lists
        if all(isinstance(k, tuple) and len(k) == 2 and isinstance(k[0], str)
               and isinstance(k[1], str) for k in distinct) and \
                len({k[0] for k in distinct}) == len(distinct):
            return keys
    except (KeyError, TypeError):
        pass
    named = [pg_of(entry) for entry in entries]
    first: dict[str, tuple[str, str]] = {}
    return [first.setdefault(name, (name, desc)) for name, desc in named]


def _program(entries: list[dict], slots: list[int], groups: int, signature: bytes,
             shared: Shared) -> _Program:
    """The first file of a signature, split by group: each group's entries built, under
    a signature of its own (the file's and the group's index)."""
    runs: list[list[int]] = [[] for _ in range(groups)]
    places = []
    for index, slot in enumerate(slots):
        places.append((slot, len(runs[slot])))
        runs[slot].append(index)
    cache: dict[int, bool] = {}
    histories = []
    for slot, run in enumerate(runs):
        history = hashlib.blake2b(signature + slot.to_bytes(4, "little"),
                                  digest_size=16).digest()
        shared.histories[history] = tuple(entry_of(entries[i], cache) for i in run)
        histories.append(history)
    return _Program(tuple(histories), tuple(places))


def _members_signature(written: object) -> bytes:
    if written is None:
        return b""
    text = written if isinstance(written, str) else repr(written)
    return hashlib.blake2b(text.encode(errors="replace"), digest_size=16).digest()


def _record_id(entry: dict) -> int:
    found = entry.get("record_id")
    return found if isinstance(found, int) else -1


def _signature(entries: list[dict], slots: list[int]) -> bytes:
    """A hash of every compared field of the file's entries (frames included: the lines)
    and of which group (by order of first appearance, not by name) each belongs to."""
    keys = [k for k in _COMPARED if entries and k in entries[0]]
    try:
        rows = list(map(itemgetter(*keys), entries)) if keys else []
    except KeyError:  # an entry lacks a field its first has: read field by field
        rows = [tuple(e.get(k) for k in keys) for e in entries]
    try:
        data = pickle.dumps((keys, rows, slots), protocol=4)
    except (pickle.PicklingError, RecursionError, TypeError):
        data = repr((keys, rows, slots)).encode()
    return hashlib.blake2b(data, digest_size=16).digest()


def _completed(dump: dict) -> dict[str, int]:
    """pg_id -> the last operation (by ``op_id``) its group's status counts completed
    (schema 2.5 on); gloo leaves every entry "scheduled", and retires entries it has not
    completed, so where a status exists, it decides."""
    status = dump.get("pg_status")
    found: dict[str, int] = {}
    for pg_id, value in (status.items() if isinstance(status, dict) else ()):
        last = value.get("last_completed_collective") if isinstance(value, dict) else None
        if isinstance(last, str) and re.fullmatch(r"-?\d+", last):
            last = int(last)  # the JSON dump writes the counts as strings
        if isinstance(last, int):
            found[str(pg_id)] = last
    return found


def _in_flight(entries: list[dict], slots: list[int], groups: int,
               completed: dict[str, int]) -> list[int]:
    """Indices of the entries not completed, oldest first, read back from the newest: a
    group's operations complete in the order they were enqueued, so a group's search
    ends at its first completed entry met (by the status's count where the dump has one,
    else by nccl's "completed" state)."""
    pending = set(range(groups))
    found = []
    index = len(entries)
    while pending and index > 0:
        index -= 1
        slot = slots[index]
        if slot not in pending:
            continue
        entry = entries[index]
        last = completed.get(str(entry.get("pg_id", "")))
        if last is not None:
            op_id = entry.get("op_id", seq_of(entry))
            done = isinstance(op_id, int) and 0 <= op_id <= last
        else:
            done = entry.get("state") in DONE_STATES
        if done:
            pending.discard(slot)
        else:
            found.append(index)
    return found[::-1]
