"""Whether a timing verdict stands, from what several runs of the same job said.

A run's steps share their neighbours on the machine, so one run can measure a rank as
slow all run long (the checks with ``CONFIRMED_BY_A_SECOND_RUN``; in ``run --fix``'s
rerun, any timing cause the first run did not report). Runs apart in time do not share
that luck: each says its alarm (a tuple of what it raised, ``()`` for quiet, None for
undecided) and the vote decides. One rule for every place that runs a job to judge it:
the runner of specs, the exercises' grader and ``run --fix``'s verifying rerun
(``until_settled``).
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

R = TypeVar("R")
MOST_RUNS = 3  # of three runs, two agree: an alarm twice, or quiet more often than not


def settled(said: Sequence[tuple | None]) -> bool:
    """Does the latest run's timing verdict stand? Quiet stands unless an earlier run
    raised an alarm the quiet runs do not outnumber; an alarm stands once two runs raised
    it."""
    alarms = sum(1 for s in said if s)
    quiet = sum(1 for s in said if s == ())
    if said[-1] == ():
        return quiet > alarms
    return said[-1] is not None and alarms >= 2


def until_settled(measure: Callable[[int], R], alarm: Callable[[R], tuple | None],
                  finished: Callable[[R], bool] = lambda _: True,
                  most: int = MOST_RUNS) -> tuple[R, list[tuple | None]]:
    """``measure(0)``, then ``measure(1)`` and on, while the runs finish and their timing
    verdict has not settled, at most ``most`` runs: the last run's result, and what each
    run said (``alarm`` of its result). A run that did not finish ends the vote: its
    verdict is not about time."""
    result = measure(0)
    said = [alarm(result)]
    while finished(result) and not settled(said) and len(said) < most:
        result = measure(len(said))
        said.append(alarm(result))
    return result, said
