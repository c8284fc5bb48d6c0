"""A rank's stalls as its trace records them, read one way by everyone who reads them.

A rank's watch notes a stall when it makes no call for its deadline. Under torchrun that
is not final: a rank waiting for a peer slow once (DDP's first construction on a loaded
machine) notes a stall, then makes calls again. And the watch decides, samples the rank
for 60 ms, then writes: a call that fails meanwhile (a peer exited) lands before the stall
in the file though it came after. The analyzer, the node's watching rank (which pokes
silent peers) and the tests all ask the same questions of a trace, answered here.
"""

from __future__ import annotations

import json
from typing import Sequence

from distdoctor.models.events import Ev

# how a stall is spelt in a trace file: found by its bytes, without parsing the file
STALL_NOTED = f'"ev":"{Ev.STALLED}"'.encode()


def last_stall(events: Sequence[dict]) -> dict:
    """The rank's last noted stall, or {}."""
    return next((e for e in reversed(events) if e.get("ev") == Ev.STALLED), {})


def still_stalled(events: Sequence[dict]) -> bool:
    """Did the rank note a stall and make no call after it? What a rank did after a stall
    it moved past (an abort included) is how it ended; its stall's evidence is stale."""
    last = max((i for i, e in enumerate(events) if e.get("ev") == Ev.STALLED), default=None)
    return last is not None and not any(e.get("ev") == Ev.ENTER for e in events[last + 1:])


def still_stalled_in(trace: bytes) -> bool:
    """``still_stalled`` of a trace file's bytes, reading only its tail from the last
    stall (a heavily traced rank's file is megabytes; its watch reads it while stalled)."""
    last = trace.rfind(STALL_NOTED)
    if last < 0:
        return False
    start = trace.rfind(b"\n", 0, last) + 1
    events = []
    for line in trace[start:].split(b"\n"):
        try:
            event = json.loads(line)
        except ValueError:
            continue  # cut short by a write still under way: not a call we can count
        if isinstance(event, dict):
            events.append(event)
    return still_stalled(events)


def stopped_raising(events: Sequence[dict]) -> str | None:
    """The error of the rank's last call when that call failed and nothing came after but
    a stall decided before the failure: the rank was raising when it was stopped (torchrun's
    SIGTERM), before it wrote its exit. A stall timed after the failure means the rank
    stayed on past it, as one that caught the error and went on would."""
    failed = max((i for i, e in enumerate(events) if e.get("ev") == Ev.ERROR), default=None)
    if failed is None:
        return None
    error, when = events[failed].get("error"), events[failed].get("t")
    if not isinstance(error, str) or not isinstance(when, (int, float)):
        return None
    for later in events[failed + 1:]:
        stall_at = later.get("t")
        if later.get("ev") != Ev.STALLED or not isinstance(stall_at, (int, float)) \
                or stall_at >= when:
            return None
    return error
