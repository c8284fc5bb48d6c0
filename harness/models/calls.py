"""The one vocabulary of calls, as torch's flight_recorder keeps one of operations: which
operations are point-to-point and which collective, which way a point-to-point call
points, how a call and a set of ranks are written for a person (and a list or a line
too long to print whole).

Every reader of calls (the live wait-for graph, the hang and mismatch checks, the report,
the pictures, check-collective) asks here, so that a send counted as point-to-point in one
place is never a collective in another, and a call reads the same in every report.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Iterable, Literal, Sequence

SENDS = frozenset({"send", "isend"})
RECEIVES = frozenset({"recv", "irecv"})
BATCH = "batch_isend_irecv"  # several sends and receives, each to its own peer
POINT_TO_POINT = SENDS | RECEIVES | {BATCH}
ASYNC_POINT_TO_POINT = frozenset({"isend", "irecv", BATCH})  # return a work to wait on
# collectives that combine the members' tensors: how gradients and averaged parameters are
# synchronised, so the tracer notes which storage each one reduced (replica groups)
REDUCING = frozenset({"all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor",
                      "reduce_scatter_single"})

Direction = Literal["send", "recv"]

# torch.distributed's Python functions that communicate, each with the argument that names
# its peer or root and, for a point-to-point call, its direction: what the tracer wraps,
# and what ``attach`` looks for in a live rank's stack
TRACED_OPS: dict[str, tuple[str | None, str | None]] = {
    "send": ("dst", "send"), "recv": ("src", "recv"),
    "isend": ("dst", "send"), "irecv": ("src", "recv"),
    "batch_isend_irecv": (None, None),
    "all_reduce": (None, None), "broadcast": ("src", None), "reduce": ("dst", None),
    "all_gather": (None, None), "all_gather_into_tensor": (None, None),
    "all_gather_single": (None, None),  # torch 2.13's name for all_gather_into_tensor
    "reduce_scatter": (None, None), "reduce_scatter_tensor": (None, None),
    "reduce_scatter_single": (None, None),
    "all_to_all": (None, None), "all_to_all_single": (None, None),
    "gather": ("dst", None), "scatter": ("src", None), "barrier": (None, None),
    "monitored_barrier": (None, None),
    # making a group: every rank of the default group makes it, members or not, in one order
    # (unless use_local_synchronization=True), so it is in the default group's sequence
    "new_group": (None, None),
}
NEW_GROUP = "new_group"
INIT_GROUP = "init_process_group"  # the default group's start-up (trace/startup.py)



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
    number = (f"#{seq}" if seq >= 0 else "") + (f" on process group {pg}" if pg else "")
    number = number.strip()  # a negative number: not known (a call read from a stack)
    shown = " ".join(str(tuple(s)) for s in shapes)
    detail = ", ".join(filter(None, [number, shown, dtype, reduce_op or ""]))
    return f"{op}{target}{f' ({detail})' if detail else ''} at {where or '?'}"


def ranks_phrase(ranks: Iterable[int]) -> str:
    """'rank 1', 'ranks 0, 2', 'ranks 1-15', 'ranks 0-31 except 7': a set of ranks short
    enough to read at 64 ranks. A run of three or more is a range; a set that is a range
    with at most three holes, eight ranks or more, is written as the range and its holes."""
    ranks = sorted(set(ranks))
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    runs = rank_runs(ranks)
    holes = sorted(set(range(ranks[0], ranks[-1] + 1)) - set(ranks)) if ranks else []
    if holes and len(holes) <= 3 and len(ranks) >= 8 and len(runs) > 1:
        return f"ranks {ranks[0]}-{ranks[-1]} except {', '.join(map(str, holes))}"
    return "ranks " + ", ".join(runs)


def first_few(items: Sequence[str], shown: int) -> str:
    """'a, b, c and 5 more': the first ``shown`` of ``items``, and how many were left out."""
    left = len(items) - shown
    return ", ".join(items[:shown]) + (f" and {left} more" if left > 0 else "")


def clipped(text: str, most: int) -> str:
    """``text`` in at most ``most`` characters, "..." where it was cut."""
    return text if len(text) <= most else text[:most - len("...")] + "..."


def grouped(said: dict[int, str], sep: str = ": ") -> list[str]:
    """'ranks 1-15: X', 'rank 0: Y': ranks that say the same thing, once, in rank order of
    their first member (one line per distinct thing at 64 ranks, not one per rank). A
    verb for a separator agrees with the ranks: " is " becomes " are " for several."""
    ranks_of: dict[str, list[int]] = {}
    for rank, text in sorted(said.items()):
        ranks_of.setdefault(text, []).append(rank)
    return [f"{ranks_phrase(ranks)}{' are ' if sep == ' is ' and len(ranks) > 1 else sep}"
            f"{text}" for text, ranks in ranks_of.items()]


def rank_runs(ranks: Iterable[int]) -> list[str]:
    """Sorted ranks as runs: [0, 1, 2, 3, 5, 7, 8] -> ['0-3', '5', '7', '8']."""
    runs: list[list[int]] = []
    for rank in sorted(set(ranks)):
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    return [f"{run[0]}-{run[-1]}" if len(run) >= 3 else ", ".join(map(str, run))
            for run in runs]


def relative_line(where: str) -> str:
    """file:line (or a file), relative to the working directory when the file is under it."""
    return _relative(where, os.getcwd())


@functools.lru_cache(maxsize=4096)
def _relative(where: str, cwd: str) -> str:
    """relative_line's work, once per line and working directory (a report of 16,384
    ranks names the same few lines thousands of times; resolving a path touches the
    file system)."""
    path, _, line = where.rpartition(":")
    if not path or not line.isdigit():
        path, line = where, ""
    try:
        path = str(Path(path).resolve().relative_to(Path(cwd)))
    except (ValueError, OSError):
        pass
    return f"{path}:{line}" if line else path
