"""One rank's dump file, read as plain data and folded into what the checks need.

A cluster's dumps are thousands of files of 2000 entries each, nearly all alike: the
ranks of one group made the same calls. So a rank's history on each group is reduced to
a signature (a hash of every field the checks compare, its group's name aside), and its
entries are built only for the first rank of each signature; the others share them. What
differs from rank to rank, how far each one got (its entries in flight), is read per rank.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import pickle
from collections import defaultdict
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


def load(path: Path) -> object:
    """A dump file's plain data: JSON, or a pickle through the plain-data unpickler.
    NotPlainData when the pickle names a class or function (nothing of it runs);
    ValueError when it is cut short or neither."""
    with open(path, "rb") as file:
        head = file.peek(1)[:1] if isinstance(file, io.BufferedReader) else b""
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


def read(path: Path, rank: int, known: set[bytes] | None = None) -> tuple[RankRead, Shared]:
    """The rank's read, and what it holds that is not in ``known`` (which it adds to).
    NotADump, NotPlainData or ValueError when the file cannot be read as a dump. Per
    entry, only C-level work: a rank's file is read in about the time the unpickler
    takes (and Python takes to free what it built)."""
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
    known = set() if known is None else known
    shared = Shared({}, {})
    completed = _completed(dump)
    histories: list[tuple[str, GroupHistory]] = []
    descs: dict[str, str] = {}
    cache: dict[int, bool] = {}
    for run in _by_group(entries):
        name, desc = pg_of(run[0])
        descs.setdefault(name, desc)
        signature = _signature(run)
        if signature not in known:
            known.add(signature)
            shared.histories[signature] = tuple(entry_of(e, cache) for e in run)
        flying = _in_flight(run, completed.get(str(run[0].get("pg_id", ""))))
        histories.append((name, GroupHistory(
            signature, flying, tuple(_record_id(run[i]) for i in flying),
            _record_id(run[-1]))))
    groups = []
    for key, (name, desc, written) in groups_of(dump).items():
        members = _members_signature(written)
        if members and members not in known:
            known.add(members)
            shared.members[members] = ranks_of(written)
        groups.append((key, Group(name, desc, members)))
    oldest = entries[0].get("record_id", 0) if entries else 0
    rank_hint = dump.get("rank")
    read_ = RankRead(
        rank=rank_hint if isinstance(rank_hint, int) and rank_hint >= 0 else rank,
        path=str(path), version=str(dump.get("version", "")), backend=backend,
        groups=tuple(groups), descs=tuple(descs.items()), histories=tuple(histories),
        oldest_record=oldest if isinstance(oldest, int) else 0, entries=len(entries))
    return read_, shared


def _members_signature(written: object) -> bytes:
    if written is None:
        return b""
    text = written if isinstance(written, str) else repr(written)
    return hashlib.blake2b(text.encode(errors="replace"), digest_size=16).digest()


def _record_id(entry: dict) -> int:
    found = entry.get("record_id")
    return found if isinstance(found, int) else -1


def _by_group(entries: list[dict]) -> list[list[dict]]:
    """The entries per group, each in the order recorded, picked out in C: a job has a
    few groups, so one pass per group over its (name, description) keys."""
    try:
        keys = list(map(itemgetter("process_group"), entries))
        distinct = list(dict.fromkeys(keys))  # TypeError for lists (JSON): by hand below
        if len(distinct) > 64:
            raise TypeError
        runs = [list(itertools.compress(entries, map(key.__eq__, keys))) for key in distinct]
    except (KeyError, TypeError):  # no process_group (before 2.1), or lists (JSON)
        grouped: dict = defaultdict(list)
        for entry in entries:
            grouped[pg_of(entry)].append(entry)
        runs = list(grouped.values())
    merged: dict[str, list[dict]] = {}
    for run in runs:  # equal names written apart ("0" and ("0", "default_pg"))
        name = pg_of(run[0])[0]
        if name in merged:
            merged[name] = sorted(merged[name] + run, key=_record_id)
        else:
            merged[name] = run
    return list(merged.values())


def _signature(run: list[dict]) -> bytes:
    """A hash of every compared field of a group's entries (frames included: the lines),
    equal for equal histories on every rank and every group."""
    keys = [k for k in _COMPARED if k in run[0]]
    try:
        rows = list(map(itemgetter(*keys), run))
    except KeyError:  # an entry lacks a field its first has: read field by field
        rows = [tuple(e.get(k) for k in keys) for e in run]
    try:
        data = pickle.dumps((keys, rows), protocol=4)
    except (pickle.PicklingError, RecursionError, TypeError):
        data = repr((keys, rows)).encode()
    return hashlib.blake2b(data, digest_size=16).digest()


def _completed(dump: dict) -> dict[str, int]:
    """pg_id -> the last operation (by ``op_id``) its group's status counts completed
    (schema 2.5 on); gloo leaves every entry "scheduled", and retires entries it has not
    completed, so where a status exists, it decides."""
    status = dump.get("pg_status")
    found: dict[str, int] = {}
    for pg_id, value in (status.items() if isinstance(status, dict) else ()):
        if isinstance(value, dict) and isinstance(value.get("last_completed_collective"), int):
            found[str(pg_id)] = value["last_completed_collective"]
    return found


def _in_flight(run: list[dict], last_completed: int | None) -> tuple[int, ...]:
    """Positions of the group's entries not completed, read back from the newest: a
    group's operations complete in the order they were enqueued, so the first completed
    one met ends the search (by the status's count where there is one, else by nccl's
    "completed" state)."""
    position = len(run)
    while position > 0:
        entry = run[position - 1]
        if last_completed is not None:
            op_id = entry.get("op_id", seq_of(entry))
            done = isinstance(op_id, int) and 0 <= op_id <= last_completed
        else:
            done = entry.get("state") in DONE_STATES
        if done:
            break
        position -= 1
    return tuple(range(position, len(run)))
