"""``distdoctor check-collective``: the collective properties, run on someone else's code.

The user's function gets our queue-mesh transport and its rank's input tensor (and the
source rank for broadcast) and returns the result. Each example runs on a rendezvous
transport (a send returns once received, as gloo's does) and then a buffered one (a send
returns at once). Hypothesis searches for a failing example and shrinks it; a wrong
answer, an exception and a hang all fail: a hang the watch proves from the calls (a cycle
of waits, a wait on a rank that returned: a fraction of a second), or a send, a receive or
a rank that makes no progress for the deadline, reported with where each rank was. Ranks
that each waited for the next around a cycle are an ordering deadlock, reported as the
cycle with every rank's line and the fix.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from typing import Iterator

from hypothesis import HealthCheck, given, settings

from distdoctor.analysis.waitfor import PROVEN
from distdoctor.collectives import KINDS  # noqa: F401 (part of this module's interface)
from distdoctor.collectives.jobs import TransportMisuse, run_user
from distdoctor.collectives.properties import Case, cases, mismatch, reduced
from distdoctor.launch.pool import shared_pool
from distdoctor.models.calls import direction, is_point_to_point
from distdoctor.models.events import Emit, Ev
from distdoctor.models.record import STOPPED

# as a path's tail: "harness/..." in a checkout, "distdoctor/..." installed
_HERE = os.path.dirname(os.path.abspath(__file__))
TRANSPORT_FILES = tuple(os.path.join(os.path.basename(os.path.dirname(_HERE)),
                                     os.path.basename(_HERE), name)
                        for name in ("transport.py", "rendezvous.py"))
# the wires every example runs on, strictest first: on a rendezvous a send returns only once
# received (gloo, NCCL with large messages, MPI_Ssend); buffered, it returns at once
WIRES = ("rendezvous", "buffered")
ORDER_FIX = ("pair sends and receives: even ranks send first, odd ranks receive first, or "
             "use isend/irecv and wait on both")
# a transport's timeout: "rank 0 waited 1 s in allreduce (...) in send to rank 1, ..."
_WAIT = re.compile(r"rank (?P<rank>\d+) waited (?P<seconds>\S+) s in .* "
                   r"(?P<how>in send to|for data from) rank (?P<peer>\d+)")


@dataclass(frozen=True)
class Failure:
    case: Case
    what: str  # "wrong result", "error", "hang" or "deadlock" (a cycle of waits)
    detail: str
    wire: str = "buffered"  # the transport it failed on
    timed_out: bool = False  # a hang that waited out the deadline (not proven from the calls)


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


# a call of the transport with arguments its methods do not take
MISUSE = "your function calls the transport with arguments it does not take"
HANG_BUDGET = 8  # proven hangs (each a fraction of a second) to shrink before stopping
WAIT_BUDGET_S = 10.0  # deadlines waited out shrinking hangs the calls cannot prove (>= one)
# after one rank raised (a receive's deadline), how long the others get before the pool
# stops them and takes their stacks: their own receives time out about together
ERROR_GRACE_S = 0.5


class _StopShrinking(BaseException):
    """Raised past the hang budget: hypothesis lets BaseExceptions through unshrunk."""


def check(target: str, kind: str, op: str, world_sizes: tuple[int, int], examples: int,
          deadline: float, wires: tuple[str, ...] = WIRES) -> tuple[Failure | None, int]:
    """The smallest failing example (or None) and how many examples ran. A hang the calls
    prove is cheap, and shrinking stops after HANG_BUDGET of them; one that waited out the
    deadline costs it again on every example, so shrinking stops before the deadlines
    waited out pass WAIT_BUDGET_S (after the first, at a long deadline). Then the smallest
    hang seen is reported."""
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
        failure = next((f for wire in wires
                        if (f := evaluate(target, kind, case, deadline, wire)) is not None), None)
        if failure is not None:
            failures.append(failure)
            if failure.what == MISUSE:
                raise _StopShrinking()  # every example fails alike: nothing to search for
            waited = deadline * sum(f.timed_out for f in failures)
            if waited + deadline > max(WAIT_BUDGET_S, deadline) or \
                    sum(f.what in ("hang", "deadlock") for f in failures) > HANG_BUDGET:
                raise _StopShrinking()
            raise AssertionError(failure.detail)

    try:
        with _hypothesis_home():
            holds()
    except AssertionError:
        return failures[-1], count  # hypothesis replays the shrunk example last
    except _StopShrinking:
        return min(failures, key=lambda f: (f.case.world_size, len(f.case.values[0]))), count
    return None, count


@contextlib.contextmanager
def _hypothesis_home() -> Iterator[None]:
    """Hypothesis keeps caches in ./.hypothesis (its constants, even with no example
    database): in a temporary folder instead, removed afterwards, so checking someone's
    function leaves nothing in their working directory."""
    from hypothesis import configuration

    before = getattr(configuration, "__hypothesis_home_directory", None)
    with tempfile.TemporaryDirectory(prefix="distdoctor-hypothesis-") as home:
        configuration.set_hypothesis_home_dir(home)
        try:
            yield
        finally:
            configuration.set_hypothesis_home_dir(before)


def evaluate(target: str, kind: str, case: Case, deadline: float,
             wire: str = "buffered") -> Failure | None:
    pool = shared_pool(case.world_size, mesh=True)
    # one deadline for both: a receive that waits it out raises, and a rank that makes no
    # call at all (a loop that never ends) is stopped by the pool's watch at the same time
    result = pool.run(run_user, target, kind, case.tensors(), case.src, deadline, wire,
                      deadline=deadline, error_grace=ERROR_GRACE_S)
    if not result.ok:
        misused = [end for end in result.ends if "TransportMisuse: " in (end.error or "")]
        if misused:
            said = [rank_text(end, ()).replace(f"{TransportMisuse.__module__}."
                                               f"{TransportMisuse.__name__}: ", "")
                    for end in misused]
            return Failure(case, MISUSE, "; ".join(said), wire)
        hung = [end for end in result.ends
                if "Timeout" in (end.error or "") or end.status in STOPPED]
        timed_out = any(not (end.error or "").startswith(PROVEN) for end in hung)
        cycle = wait_cycle(result.ends, result.events, result.traces)
        if cycle:
            return Failure(case, "deadlock",
                           deadlock_text(cycle, result.ends, result.events, wire,
                                         result.traces), wire, timed_out)
        hang = bool(hung)
        lines = [rank_text(end, events) for end, events in zip(result.ends, result.events)
                 if not end.ok]
        return Failure(case, "hang" if hang else "error", "; ".join(lines), wire, timed_out)
    problem = mismatch(kind, case, list(result.values))
    return Failure(case, "wrong result", problem, wire) if problem else None


def waits_of(ends, events, traces=()) -> dict[int, tuple[str, int, str]]:
    """Whom each rank that did not finish was waiting for: rank -> (how, peer, line). From
    its own timeout when it raised one; else, for a rank the pool stopped, from the last
    wait its transport reported ("waiting", what, peer) and the line its stack was at; else,
    for a rank stopped by the watch's proof, from the send or receive its trace shows open
    (the very call the proof held open for CONFIRM_S: on a loaded machine the proof can
    stop a rank before its transport has reported the wait, 0.05 s in)."""
    from distdoctor.models.record import user_frame
    from distdoctor.userjob.reporting.report import raising_line

    waits = {}
    for end, emitted, trace in zip(ends, events, traces or ((),) * len(ends)):
        found = _WAIT.search(end.error or "")
        if found and int(found["rank"]) == end.rank:
            how = "in send to" if found["how"] == "in send to" else "in recv from"
            waits[end.rank] = (how, int(found["peer"]), raising_line(end.error) or "?")
            continue
        reported = [e for e in emitted if isinstance(e, tuple) and e[:1] == (Emit.WAITING,)]
        if end.status in STOPPED and reported:
            _, what, peer = reported[-1]
            frame = user_frame(end.stacks)
            waits[end.rank] = ("in send to" if what == "send" else "in recv from", peer,
                               frame.place if frame else "?")
        elif end.status in STOPPED and (end.error or "").startswith(PROVEN):
            call = open_transfer(trace)
            if call is not None:
                waits[end.rank] = ("in send to" if direction(call["op"]) == "send"
                                   else "in recv from", call["peer"], call.get("where") or "?")
    return waits


def open_transfer(trace) -> dict | None:
    """The last send or receive of our transport a rank's trace shows entered and never
    done nor failed: the call it was stopped in."""
    closed = {event.get("id") for event in trace if event.get("ev") in (Ev.DONE, Ev.ERROR)}
    entered = [event for event in trace if event.get("ev") == Ev.ENTER
               and is_point_to_point(str(event.get("op")))
               and isinstance(event.get("peer"), int) and event.get("id") not in closed]
    return entered[-1] if entered else None


def wait_cycle(ends, events, traces=()) -> list[int]:
    """Ranks that each wait for the next (in a send to it, or for its data) around a
    cycle: an ordering deadlock. [] when the waits form no cycle."""
    from distdoctor.analysis.waitfor import cycle_of

    waits = {rank: {peer} for rank, (_, peer, _) in waits_of(ends, events, traces).items()}
    return cycle_of(waits) or []


def deadlock_text(cycle: list[int], ends, events, wire: str, traces=()) -> str:
    ring = " -> ".join(map(str, cycle + [cycle[0]]))
    waits = waits_of(ends, events, traces)
    each = "; ".join(f"rank {rank} {waits[rank][0]} rank {waits[rank][1]} at {waits[rank][2]}"
                     for rank in sorted(cycle))
    return (f"ordering deadlock on the {wire} transport: ranks {ring} each wait for the next: "
            f"{each}. fix: {ORDER_FIX}")


def rank_text(end, events) -> str:
    """What one rank that did not finish was doing: its error at the user's line, or, for a
    rank the pool stopped, where its stack was and whether it ever sent or received."""
    from distdoctor.models.record import seen_at_text
    from distdoctor.userjob.reporting.report import raising_line

    if end.status not in STOPPED:
        where = raising_line(end.error) or ""
        return f"rank {end.rank}: {end.headline}" + (f" at {where}" if where else "")
    if (end.error or "").startswith(PROVEN):  # the watch's proof names every call in it
        return f"rank {end.rank}: stopped {end.at or 0:.2f} s after the start, {end.error}"
    frame = end.running_at
    place = f"{frame.function} at {frame.place}" if frame else "no stack"
    place += seen_at_text(end.seen)
    in_transport = any(f.file.endswith(TRANSPORT_FILES) for s in end.stacks if s.main
                       for f in s.frames)
    called = any(isinstance(e, tuple) and e[:1] == (Emit.TRANSPORT_CALL,) for e in events)
    doing = ("waiting in the transport" if in_transport else
             "in no send or receive" + ("" if called else ", and it never entered one"))
    return (f"rank {end.rank}: stopped {end.at or 0:.2f} s after the start, {doing}: "
            f"running {place}")


def describe(failure: Failure, kind: str) -> str:
    case = failure.case
    numel = len(case.values[0]) if case.values else 0
    on = f" on the {failure.wire} transport" if failure.wire != "buffered" else ""
    if failure.what == MISUSE:
        from distdoctor.collectives import USER_API

        return "\n".join([f"{MISUSE}, on the first example:", f"  {failure.detail}",
                          "  the transport's methods: " + "; ".join(t for t, _ in USER_API)])
    lines = [f"smallest failing example (shrunk by hypothesis): {failure.what}{on}",
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
