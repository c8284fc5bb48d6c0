"""The one vocabulary of calls, as torch's flight_recorder keeps one of operations: which
operations are point-to-point and which collective, which way a point-to-point call
points, how a call and a set of ranks are written for a person.

Every reader of calls (the live wait-for graph, the hang and mismatch checks, the report,
the pictures, check-collective) asks here, so that a send counted as point-to-point in one
place is never a collective in another, and a call reads the same in every report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Literal

SENDS = frozenset({"send", "isend"})
RECEIVES = frozenset({"recv", "irecv"})
BATCH = "batch_isend_irecv"  # several sends and receives, each to its own peer
POINT_TO_POINT = SENDS | RECEIVES | {BATCH}
ASYNC_POINT_TO_POINT = frozenset({"isend", "irecv", BATCH})  # return a work to wait on

Direction = Literal["send", "recv"]


def is_point_to_point(op: str) -> bool:
    """A send, a receive, or a batch of them: it waits for its peers, not for a group."""
    return op in POINT_TO_POINT


def is_collective(op: str) -> bool:
    """Every member of a group makes it, at one number of the group's sequence."""
    return op not in POINT_TO_POINT


def direction(op: str) -> Direction:
    """Which way a single send or receive points (a batch has one per peer)."""
    return "send" if op in SENDS else "recv"


def describe_call(op: str, peer: int | None, seq: int, shapes: Iterable = (),
                  dtype: str = "", reduce_op: str | None = None, pg: str | None = None,
                  where: str = "") -> str:
    """'send to 3 (#1, (2, 32, 16), float32) at handrolled.py:52': the op, its peer or
    root, its number (on a named group, that group), shapes, dtype, reduce op, and line."""
    target = (f" to {peer}" if op in SENDS else f" from {peer}" if op in RECEIVES else
              f" rooted at {peer}" if peer is not None and op != BATCH else "")
    number = f"#{seq}" + (f" on process group {pg}" if pg else "")
    shown = " ".join(str(tuple(s)) for s in shapes)
    detail = ", ".join(filter(None, [number, shown, dtype, reduce_op or ""]))
    return f"{op}{target} ({detail}) at {where or '?'}"


def ranks_phrase(ranks: Iterable[int]) -> str:
    """'rank 1' or 'ranks 0, 2', in rank order."""
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def relative_line(where: str) -> str:
    """file:line (or a file), relative to the working directory when the file is under it."""
    path, _, line = where.rpartition(":")
    if not path or not line.isdigit():
        path, line = where, ""
    try:
        path = str(Path(path).resolve().relative_to(Path.cwd()))
    except (ValueError, OSError):
        pass
    return f"{path}:{line}" if line else path
