"""One vocabulary for a Flight Recorder dump, whatever version of torch wrote it.

torch has written its dumps in schema versions 2.x ("2.10" from torch 2.13); fields were
added over time (``collective_seq_id``/``p2p_seq_id`` split from ``seq_id``, ``input_dtypes``,
``is_p2p``, ``pg_status``, ``thread_id``) and gloo fills some differently from nccl (its
entries stay "scheduled" after they complete; its ``pg_config`` is keyed ""). Every reader
here goes through these names, so a new version changes this file only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from distdoctor.models.record import Frame, is_user_frame

DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
          "Long": "int64", "Int": "int32", "Short": "int16", "Bool": "bool", "Byte": "uint8",
          "Char": "int8"}
# torch's internal names of collectives, as the Python functions the tracer names them by
OPS = {"_all_gather_base": "all_gather_into_tensor", "_allgather_base": "all_gather_into_tensor",
       "allgather": "all_gather",
       "_reduce_scatter_base": "reduce_scatter_tensor", "allreduce": "all_reduce",
       "all_reduce_barrier": "barrier", "alltoall_base": "all_to_all_single",
       "alltoall": "all_to_all", "ALLGATHER_coalesced": "all_gather_into_tensor_coalesced",
       "REDUCE_SCATTER_coalesced": "reduce_scatter_tensor_coalesced",
       "allreduce_coalesced": "all_reduce_coalesced", "_broadcast_oop": "broadcast",
       "_reduce_oop": "reduce"}
DEFAULT_DESC = "default_pg"  # torch's description of the default group
DONE_STATES = frozenset({"completed"})
# torch's profiling names of point-to-point operations: "nccl:send 0->1", "nccl:recv 1<-0"
_SEND = re.compile(r"send (\d+)->(\d+)")
_RECV = re.compile(r"recv (\d+)<-(\d+)")


@dataclass(frozen=True, slots=True)
class Entry:
    """One operation a rank's recorder held, as the checks compare it across ranks (its
    group aside: ranks of different groups of one shape share entries): its number there
    (``collective_seq_id``; a send's or receive's ``p2p_seq_id``), kind, peer (a group
    rank), input sizes, dtype and the user's innermost line that led to it."""

    seq: int
    op: str
    peer: int | None
    sizes: tuple[tuple[int, ...], ...]
    dtype: str
    where: str
    p2p: bool


@dataclass(frozen=True, slots=True)
class Group:
    """A process group as the dump's ``pg_config`` describes it: its name, torch's
    description ("default_pg", "undefined", a user's), and the signature of its global
    ranks (the default group's list is as long as the job: it is parsed and sent once per
    signature, never once per rank; b"" when not given)."""

    name: str
    desc: str
    members: bytes


def op_of(profiling_name: object) -> tuple[str, int | None, int | None]:
    """("send", from, to) or ("recv", to, from) in group ranks, or (op, None, None), from
    torch's profiling name "nccl:all_reduce", "gloo:broadcast", "nccl:send 0->1"."""
    name = str(profiling_name or "").partition(":")[2] or str(profiling_name or "")
    if (match := _SEND.fullmatch(name)) is not None:
        return "send", int(match[1]), int(match[2])
    if (match := _RECV.fullmatch(name)) is not None:
        return "recv", int(match[1]), int(match[2])
    op = name.split(" ")[0] or "?"
    return OPS.get(op, op), None, None


def backend_of(profiling_name: object) -> str:
    """"nccl", "gloo", ... from a profiling name ("" when it names none)."""
    head, sep, _ = str(profiling_name or "").partition(":")
    return head if sep else ""


def dtype_of(dtypes: object) -> str:
    """The first input dtype in torch's spelling ("Float") as the tracer writes it."""
    first = dtypes[0] if isinstance(dtypes, (list, tuple)) and dtypes else ""
    return DTYPES.get(str(first), str(first).lower())


def sizes_of(sizes: object) -> tuple[tuple[int, ...], ...]:
    if not isinstance(sizes, (list, tuple)):
        return ()
    return tuple(tuple(int(n) for n in s) for s in sizes if isinstance(s, (list, tuple)))


def pg_of(entry: dict) -> tuple[str, str]:
    """(name, description) of the entry's group: ``process_group`` from schema 2.1 on,
    else the numeric ``pg_id``."""
    named = entry.get("process_group")
    if isinstance(named, (list, tuple)) and named:
        return str(named[0]), str(named[1]) if len(named) > 1 else ""
    return str(entry.get("pg_id", "")), ""


def seq_of(entry: dict) -> int:
    """The entry's collective number (``seq_id`` before schema 2.2)."""
    value = entry.get("collective_seq_id", entry.get("seq_id", -1))
    return int(value) if isinstance(value, int) else -1


def user_line(frames: object, cache: dict[int, bool] | None = None) -> str:
    """file:line of the innermost of the user's frames (the recorder lists innermost
    first), or "". torch writes each frame once and refers to it from every entry that
    shares it, so ``cache`` (by the frame's identity, within one dump) saves the test."""
    for frame in frames if isinstance(frames, (list, tuple)) else ():
        if not isinstance(frame, dict):
            continue
        mine = cache.get(id(frame)) if cache is not None else None
        if mine is None:
            mine = is_user_frame(Frame(str(frame.get("filename", "")),
                                       int(frame.get("line", 0) or 0), ""))
            if cache is not None:
                cache[id(frame)] = mine
        if mine:
            return f"{frame.get('filename')}:{frame.get('line')}"
    return ""


def entry_of(entry: dict, cache: dict[int, bool] | None = None) -> Entry:
    """An entry as plain data from a dump, in this vocabulary (its group is ``pg_of``'s;
    ValueError, TypeError or KeyError when it is not of torch's shape)."""
    op, first, second = op_of(entry["profiling_name"])
    p2p = bool(entry.get("is_p2p", op in ("send", "recv")))
    peer = second  # "send 0->1": group rank 0 sends to 1; "recv 1<-0": 1 receives from 0
    seq = int(entry.get("p2p_seq_id", -1)) if p2p else seq_of(entry)
    return Entry(seq, op, peer, sizes_of(entry.get("input_sizes")),
                 dtype_of(entry.get("input_dtypes")), user_line(entry.get("frames"), cache),
                 p2p)


def groups_of(dump: dict) -> dict[str, tuple[str, str, object]]:
    """The dump's ``pg_config``: key -> (name, description, its ranks as written: "[0, 1]"
    or a list)."""
    found: dict[str, tuple[str, str, object]] = {}
    config = dump.get("pg_config")
    for key, value in (config.items() if isinstance(config, dict) else ()):
        if isinstance(value, dict):
            found[str(key)] = (str(value.get("name", key)), str(value.get("desc", "")),
                               value.get("ranks"))
    return found


def ranks_of(written: object) -> tuple[int, ...] | None:
    """A group's global ranks from "[0, 1, 2]" or [0, 1, 2]; None when not of that form."""
    if isinstance(written, str):
        if not re.fullmatch(r"\[[\d,\s]*\]", written):
            return None
        return tuple(int(r) for r in re.findall(r"\d+", written))
    if isinstance(written, (list, tuple)) and all(isinstance(r, int) for r in written):
        return tuple(written)
    return None
