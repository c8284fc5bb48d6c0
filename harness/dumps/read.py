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
    last_record: int  # the record id of its newest entry (orders the rank's groups)


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


def read(path: Path, rank: int, known: set[bytes] | None = None
         ) -> tuple[RankRead, dict[bytes, tuple[Entry, ...]]]:
    """The rank's read, and the entries of each history whose signature is not in
    ``known`` (which it adds to). NotADump, NotPlainData or ValueError when the file
    cannot be read as a dump."""
    dump = load(path)
    if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list):
        raise NotADump("plain data, but not a Flight Recorder dump (no list of entries)")
    entries = [e for e in dump["entries"] if isinstance(e, dict) and "profiling_name" in e]
    if len(entries) < len(dump["entries"]):
        raise NotADump(f"{len(dump['entries']) - len(entries)} of its entries are not "
                       f"of torch's shape")
    known = set() if known is None else known
    done = _completed(dump, entries)
    rank_hint = dump.get("rank")
    histories: list[tuple[str, GroupHistory]] = []
    new: dict[bytes, tuple[Entry, ...]] = {}
    descs: dict[str, str] = {}
    cache: dict[int, bool] = {}
    for name, run in _by_group(entries):
        descs.setdefault(name, pg_of(run[0])[1])
        signature = _signature(run)
        if signature not in known:
            known.add(signature)
            new[signature] = tuple(entry_of(e, cache) for e in run)
        in_flight = tuple(i for i, e in enumerate(run) if not done(name, e))
        newest = run[-1].get("record_id")
        histories.append((name, GroupHistory(signature, in_flight,
                                             newest if isinstance(newest, int) else -1)))
    oldest = min((e.get("record_id", 0) for e in entries
                  if isinstance(e.get("record_id"), int)), default=0)
    read_ = RankRead(
        rank=rank_hint if isinstance(rank_hint, int) and rank_hint >= 0 else rank,
        path=str(path), version=str(dump.get("version", "")),
        backend=next((backend_of(e["profiling_name"]) for e in entries), ""),
        groups=tuple(groups_of(dump).items()), descs=tuple(descs.items()),
        histories=tuple(histories), oldest_record=oldest, entries=len(entries))
    return read_, new


def _by_group(entries: list[dict]) -> list[tuple[str, list[dict]]]:
    """The entries per group, each in the order recorded."""
    named = sorted(((pg_of(e)[0], i) for i, e in enumerate(entries)), key=itemgetter(0))
    return [(name, [entries[i] for _, i in run])
            for name, run in itertools.groupby(named, key=itemgetter(0))]


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


def _completed(dump: dict, entries: list[dict]):
    """Did an entry complete? Where the dump has its group's status (schema 2.5 on), the
    status says (it counts operations by ``op_id``; gloo leaves every entry "scheduled",
    and retires entries it has not completed); else the entry's state (nccl's
    "completed")."""
    status = dump.get("pg_status")
    status = status if isinstance(status, dict) else {}
    completed: dict[str, int] = {}
    for pg_id, value in status.items():
        if isinstance(value, dict) and isinstance(value.get("last_completed_collective"), int):
            completed[str(pg_id)] = value["last_completed_collective"]
    names = {pg_of(e)[0]: str(e.get("pg_id", "")) for e in entries}

    def done(name: str, entry: dict) -> bool:
        last = completed.get(names.get(name, ""))
        if last is None:
            return entry.get("state") in DONE_STATES
        op_id = entry.get("op_id", seq_of(entry))
        return isinstance(op_id, int) and 0 <= op_id <= last

    return done
