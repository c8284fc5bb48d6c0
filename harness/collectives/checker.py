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
    result = pool.run(run_user, target, kind, case.tensors(), case.src, deadline,
                      deadline=deadline + 10, error_grace=deadline + 2)
    if not result.ok:
        from harness.doctor.report import raising_line

        lines = []
        hang = False
        for end in result.ends:
            if end.ok:
                continue
            hang |= "RecvTimeout" in (end.error or "") or end.status in ("hung", "stopped")
            where = raising_line(end.error) or ""
            lines.append(f"rank {end.rank}: {end.headline}" + (f" at {where}" if where else ""))
        return Failure(case, "hang" if hang else "error", "; ".join(lines))
    problem = mismatch(kind, case, list(result.values))
    return Failure(case, "wrong result", problem) if problem else None


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
