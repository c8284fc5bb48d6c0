"""``distdoctor check-collective``: the collective properties, run on someone else's code.

The user's function gets our queue-mesh transport and its rank's input tensor (and the
source rank for broadcast) and returns the result. Hypothesis searches for a failing
example and shrinks it; a wrong answer, an exception and a hang all fail, a hang being any
receive that waits longer than the deadline, reported with where each rank waited.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings

from harness.collectives import KINDS  # noqa: F401 (part of this module's interface)

from harness.collectives.jobs import run_user
from harness.collectives.properties import Case, cases, mismatch, reduced
from harness.launch.pool import shared_pool

TRANSPORT_FILE = os.path.join("harness", "collectives", "transport.py")


@dataclass(frozen=True)
class Failure:
    case: Case
    what: str  # "wrong result", "error" or "hang"
    detail: str


def load(target: str):
    """Import MODULE:FUNCTION (from the working directory too) before any rank is forked."""
    module, _, name = target.partition(":")
    if not module or not name:
        raise ValueError(f"expected MODULE:FUNCTION, got {target!r}")
    sys.path.insert(0, os.getcwd())
    try:
        function = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load {target}: {exc}") from None
    if not callable(function):
        raise ValueError(f"{target} is not callable")
    return function


HANG_BUDGET = 8  # deadlines' worth of hangs to spend shrinking one before stopping
# after one rank raised (a receive's deadline), how long the others get before the pool
# stops them and takes their stacks: their own receives time out about together
ERROR_GRACE_S = 0.5


class _StopShrinking(BaseException):
    """Raised past the hang budget: hypothesis lets BaseExceptions through unshrunk."""


def check(target: str, kind: str, op: str, world_sizes: tuple[int, int], examples: int,
          deadline: float) -> tuple[Failure | None, int]:
    """The smallest failing example (or None) and how many examples ran. Every hanging
    example costs a deadline, so after HANG_BUDGET of them the search stops and reports
    the smallest hang seen."""
    load(target)
    failures: list[Failure] = []
    count = 0

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              report_multiple_bugs=False, print_blob=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=cases(ops=(op,), any_source=kind == "broadcast", world_sizes=world_sizes))
    def holds(case: Case) -> None:
        nonlocal count
        count += 1
        failure = evaluate(target, kind, case, deadline)
        if failure is not None:
            failures.append(failure)
            if sum(f.what == "hang" for f in failures) > HANG_BUDGET:
                raise _StopShrinking()
            raise AssertionError(failure.detail)

    try:
        holds()
    except AssertionError:
        return failures[-1], count  # hypothesis replays the shrunk example last
    except _StopShrinking:
        return min(failures, key=lambda f: (f.case.world_size, len(f.case.values[0]))), count
    return None, count


def evaluate(target: str, kind: str, case: Case, deadline: float) -> Failure | None:
    pool = shared_pool(case.world_size, mesh=True)
    # one deadline for both: a receive that waits it out raises, and a rank that makes no
    # call at all (a loop that never ends) is stopped by the pool's watch at the same time
    result = pool.run(run_user, target, kind, case.tensors(), case.src, deadline,
                      deadline=deadline, error_grace=ERROR_GRACE_S)
    if not result.ok:
        hang = any("RecvTimeout" in (end.error or "") or end.status in ("hung", "stopped")
                   for end in result.ends)
        lines = [rank_text(end, events) for end, events in zip(result.ends, result.events)
                 if not end.ok]
        return Failure(case, "hang" if hang else "error", "; ".join(lines))
    problem = mismatch(kind, case, list(result.values))
    return Failure(case, "wrong result", problem) if problem else None


def rank_text(end, events) -> str:
    """What one rank that did not finish was doing: its error at the user's line, or, for a
    rank the pool stopped, where its stack was and whether it ever sent or received."""
    from harness.doctor.report import raising_line
    from harness.models.record import user_frame

    if end.status not in ("hung", "stopped"):
        where = raising_line(end.error) or ""
        return f"rank {end.rank}: {end.headline}" + (f" at {where}" if where else "")
    frame = user_frame(end.stacks)
    place = f"{frame.function} at {frame.file}:{frame.line}" if frame else "no stack"
    in_transport = any(f.file.endswith(TRANSPORT_FILE) for s in end.stacks if s.main
                       for f in s.frames)
    called = any(isinstance(e, tuple) and e[:1] == ("transport-call",) for e in events)
    doing = ("waiting in the transport" if in_transport else
             "in no send or receive" + ("" if called else ", and it never entered one"))
    return (f"rank {end.rank}: stopped {end.at or 0:.2f} s after the start, {doing}: "
            f"running {place}")


def describe(failure: Failure, kind: str) -> str:
    case = failure.case
    numel = len(case.values[0]) if case.values else 0
    lines = [f"smallest failing example (shrunk by hypothesis): {failure.what}",
             f"  world size {case.world_size}, {numel} {case.dtype} element"
             f"{'s' * (numel != 1)} per rank"
             + (f", op {case.op}" if kind in ("allreduce", "reduce_scatter") else "")
             + (f", source rank {case.src}" if kind == "broadcast" else ""),
             "  inputs:   " + "; ".join(f"rank {r}: {v}" for r, v in enumerate(case.values))]
    if failure.what == "wrong result" and kind == "allreduce":
        lines.append(f"  expected: {reduced(case).tolist()} on every rank")
    lines.append(f"  {'got' if failure.what == 'wrong result' else 'what happened'}: "
                 f"{failure.detail}")
    return "\n".join(lines)
