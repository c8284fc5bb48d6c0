"""Driving warm ranks from the parent: send a job, read its verdict. Shared by the plugin's
``world_size`` tests, its ``ranks`` fixture and the assertion helpers."""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from distdoctor.testing.verdict import Outcome

ERROR_GRACE = 1.0  # seconds other ranks get to end after one fails


# the pytest session's clock, when the plugin runs one: seconds before something else ends
# the running test (pytest-timeout, less a margin), or None. A job's deadline is cut to
# it, so its report comes first. Helpers called from a test's body cannot reach pytest's
# config, hence one holder here, set through time_left_from.
_clock: list[Callable[[], float | None]] = []


def time_left_from(clock: Callable[[], float | None] | None) -> None:
    """Use ``clock`` for the seconds the running test has left (None: no clock)."""
    _clock[:] = [clock] if clock is not None else []


def cut(deadline: float) -> float:
    """``deadline``, or less when the running test would be ended sooner."""
    left = _clock[0]() if _clock else None
    return min(deadline, left) if left else deadline


def positive(value: Any, where: str) -> float:
    """``value`` as a finite positive number of seconds, else ValueError naming ``where``."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where} must be a number of seconds, got {value!r}") from None
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{where} must be a positive number of seconds, got {value!r}")
    return seconds


class Ranks:
    """``ranks(n)``: drive n warm ranks from a test in the parent."""

    def __init__(self, world_size: int, deadline: float):
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise ValueError(f"world size must be a positive whole number, got {world_size!r}")
        self.world_size = world_size
        self.deadline = positive(deadline, "deadline")

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """``fn(*args, **kwargs)`` on every rank, with the default process group up; the
        per-rank results in rank order, or RankFailure naming the cause."""
        __tracebackhide__ = True
        from distdoctor.testing import onrank

        sendable(fn, f"function {getattr(fn, '__qualname__', fn)!r}",
                  "pass a function defined at module level")
        sendable((args, kwargs), "the arguments")
        deadline = cut(self.deadline)
        result = run_on(self.world_size, deadline, onrank.call, fn, args, kwargs)
        outcome = judge_job(result, deadline, getattr(fn, "__qualname__", "job"))
        if outcome.status != "passed":
            raise outcome.failure()
        return [value for value, _ in result.values]


class RanksFactory:
    """What the ``ranks`` fixture gives: ``ranks(n, deadline=None)`` is a Ranks."""

    def __init__(self, deadline: float):
        self.deadline = deadline

    def __call__(self, world_size: int, deadline: float | None = None) -> Ranks:
        return Ranks(world_size, self.deadline if deadline is None else deadline)

    def __repr__(self) -> str:
        return f"ranks(deadline={self.deadline:g})"


def picklable(value: Any) -> bool:
    try:
        sendable(value, "value")
    except TypeError:
        return False
    return True


def sendable(value: Any, what: str, hint: str = "") -> None:
    try:
        pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 (raised again as one TypeError that names it)
        raise TypeError(f"{what} cannot be sent to the ranks (pickle: {exc})"
                        + (f"; {hint}" if hint else "")) from None


def run_on(n: int, deadline: float, fn: Callable[..., Any], *args: Any,
           evidence: bool = False):
    """``fn(ctx, *args)`` on the warm n-rank pool, stopped at ``deadline`` seconds."""
    from distdoctor.launch.pool import shared_pool

    pool = shared_pool(n, evidence=evidence)
    result = pool.run(fn, *args, deadline=deadline, limit=deadline, error_grace=ERROR_GRACE)
    if result.ok and any(_group_gone(v) for v in result.values):
        pool.reset()
    return result


def _group_gone(value: Any) -> bool:
    """Did the test destroy the default process group (its output says)?"""
    output = value[1] if isinstance(value, tuple) and len(value) == 2 else value
    return isinstance(output, dict) and output.get("group") is False


def judge_job(result, deadline: float, what: str) -> Outcome:
    """Show what the ranks printed (pytest captures it as the test's output), then judge."""
    from distdoctor.testing.onrank import echo
    from distdoctor.testing.verdict import judge

    echo(result.events)
    return judge(result, deadline, what)


