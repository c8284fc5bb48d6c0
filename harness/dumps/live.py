"""The collectives a rank has started and not finished, read from torch's Flight Recorder.

The tracer sees only calls made through ``torch.distributed``'s Python functions. DDP's
bucket all-reduces and its bucket-rebuild broadcast are made from C++, so a rank inside one
looks to the tracer as if it were computing, and no proof can include it. The Flight
Recorder (on for gloo and nccl, 2000 entries by default) numbers every collective of a
process group as the backend pairs them. So a rank's entry #k tells which op it put at the
k-th place of that group, whoever made the call. (The recorder's status counts sends and
receives among its operations, which ranks make in different numbers: a pipeline's middle
stages twice an end stage's; it is translated into the collectives' own numbering.) Read
in a rank's stack thread while the main thread is blocked (about a millisecond), only
when the parent asks.
"""

from __future__ import annotations

import json

from distdoctor.models.plaindata import loads_plain
from distdoctor.models.record import Recorded


def in_flight() -> dict[str | None, dict]:
    """Per process group (None: the default group, as the tracer names it), the last
    collective number enqueued and completed, and the op of each one in between:
    ``{"enqueued": 7, "completed": 6, "ops": {7: "broadcast"}}``. Empty when the recorder
    is off or unreadable."""
    try:
        import torch.distributed.distributed_c10d as c10d
        from torch._C._distributed_c10d import (  # type: ignore[attr-defined]
            _dump_fr_trace_json,  # in torch's C module, but not in its type stubs
        )

        dump = json.loads(_dump_fr_trace_json(includeCollectives=True, onlyActive=False))
        default = c10d._get_default_group().group_name
    # No recorder to read (no group, no dump support): the caller has no history and says so.
    except Exception:  # noqa: BLE001
        return {}
    names: dict = {}
    ops: dict = {}
    op_ids: dict = {}
    for entry in dump.get("entries", ()):
        pg = str(entry.get("pg_id"))
        name = (entry.get("process_group") or [None])[0]
        names[pg] = None if name == default else name
        if not entry.get("is_p2p"):
            seq = int(entry["collective_seq_id"])
            ops.setdefault(pg, {})[seq] = str(entry.get("profiling_name", "")).partition(":")[2]
            op_ids.setdefault(pg, {})[seq] = int(entry.get("op_id", seq))
    found = {}
    for pg, status in (dump.get("pg_status") or {}).items():
        if pg not in names:
            continue
        # the status counts every operation, sends and receives too, which ranks make in
        # different numbers; collectives are numbered apart (collective_seq_id), the same
        # on every rank: the status is translated into that numbering
        by_op = op_ids.get(pg, {})
        enqueued = _last(by_op, int(status["last_enqueued_collective"]))
        completed = _last(by_op, int(status["last_completed_collective"]))
        found[names[pg]] = {"enqueued": enqueued, "completed": completed,
                            "ops": {k: v for k, v in ops.get(pg, {}).items() if k > completed}}
    return found


def _last(by_op: dict[int, int], op_id: int) -> int:
    """The last collective number whose operation id is at most ``op_id`` (the collectives
    older than the recorder's buffer counted as done: it keeps the newest)."""
    done = [seq for seq, op in by_op.items() if op <= op_id]
    if done:
        return max(done)
    return min(by_op) - 1 if by_op else 0


def history() -> dict[str | None, list[list]]:
    """Per process group (None: the default group), every collective the recorder still
    holds, oldest first, as ``[seq, op, sizes, dtype, where]``: what the hang check
    compares across ranks (torch's own collectives included, with the user's line that
    led to each). Empty when the recorder is off or unreadable. Read from the dump with
    stack traces, through the plain-data unpickler like any other dump."""
    try:
        import torch.distributed.distributed_c10d as c10d

        dump = loads_plain(dump_bytes())
        default = c10d._get_default_group().group_name
    # No recorder to read (no group, no dump support): the caller has no history and says so.
    except Exception:  # noqa: BLE001
        return {}
    return history_of(dump, default)


def dump_bytes() -> bytes:
    """The rank's Flight Recorder dump as torch writes it on a watchdog timeout (a pickle
    of plain data, its Python frames included): what ``analyze`` reads from any job."""
    from torch._C._distributed_c10d import (  # type: ignore[attr-defined]
        _dump_fr_trace,  # in torch's C module, but not in its type stubs
    )

    return _dump_fr_trace(True, True, False)


def history_of(dump: object, default: str | None = None) -> dict[str | None, list[list]]:
    """A Flight Recorder dump (plain data, as torch writes it) as ``history()`` gives it:
    per process group (None: the default group, named ``default`` or, when that is not
    known, described "default_pg" by torch), ``[seq, op, sizes, dtype, where]`` for
    each collective, in the dump vocabulary (dumps/schema.py). Entries that are not of
    torch's shape are skipped."""
    from distdoctor.dumps.schema import DEFAULT_DESC, entry_of, pg_of

    if not isinstance(dump, dict):
        return {}
    found: dict[str | None, list[list]] = {}
    cache: dict[int, bool] = {}
    for entry in dump.get("entries", ()) or ():
        try:
            if not isinstance(entry, dict):
                continue
            made = entry_of(entry, cache)
            if made.p2p:
                continue
            name, desc = pg_of(entry)
            default_group = name == default if default is not None else desc == DEFAULT_DESC
            found.setdefault(None if default_group else name, []).append(
                [made.seq, made.op, [list(s) for s in made.sizes], made.dtype, made.where])
        except (TypeError, ValueError, KeyError, AttributeError):
            continue
    return found


def recorded(history: dict | None) -> tuple[Recorded, ...]:
    """A rank's history (``history()``, or as read back from JSON, where the default
    group's key is "") as Recorded collectives; entries that are not of its shape are
    skipped (a file from elsewhere is data, never trusted)."""
    found = []
    for pg, entries in (history or {}).items():
        for entry in entries if isinstance(entries, list) else ():
            try:
                seq, op, sizes, dtype, where = entry
                found.append(Recorded(pg or None, int(seq), str(op),
                                      tuple(tuple(int(n) for n in s) for s in sizes),
                                      str(dtype), str(where)))
            except (TypeError, ValueError):
                continue
    return tuple(found)
