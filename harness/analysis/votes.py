"""Whether a timing verdict stands, from what several runs of the same job said.

A run's steps share their neighbours on the machine, so one run can measure a rank as
slow all run long (checks with ``CONFIRMED_BY_A_SECOND_RUN``). Runs apart in time do not
share that luck: each says its alarm (a tuple of what it raised, ``()`` for quiet, None
for undecided) and the vote decides. Used by the runner of specs and by the exercises'
grader alike.
"""

from __future__ import annotations

from typing import Sequence


def settled(said: Sequence[tuple | None]) -> bool:
    """Does the latest run's timing verdict stand? Quiet stands unless an earlier run
    raised an alarm the quiet runs do not outnumber; an alarm stands once two runs raised
    it."""
    alarms = sum(1 for s in said if s)
    quiet = sum(1 for s in said if s == ())
    if said[-1] == ():
        return quiet > alarms
    return said[-1] is not None and alarms >= 2
