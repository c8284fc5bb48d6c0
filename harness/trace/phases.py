"""Where a rank's time goes between its collectives: the evidence the straggler check reads
to say why one rank arrives last.

Four spans of the main thread are timed where torch lets a wrapper see them: a data
loader's ``__next__`` (the wait for a batch, worker processes or not), a DDP forward,
a backward (``torch.autograd.backward``, which ``Tensor.backward`` calls; under DDP it
includes the wait for the gradient all-reduce), and an optimiser step (torch's global
pre/post step hooks). Each is one short JSON line as it ends, a few microseconds a step.

The rest of a step is the user's own code: logging, a checkpoint, a metric, extra work
on one rank. A sampler thread looks at the main thread every ``SAMPLE_S`` and, when it
is in none of the spans and in no collective, counts the user's innermost line there.
A gap shorter than the period is seen in proportion to its length, so the lines that
take the time are the ones counted, and short gaps cost nothing. The counts of a step
are written when its optimiser step ends (and at the job's end), never while a rank
runs: a rank spinning in its own code writes nothing, as before, and reads as hung.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from typing import Any, Callable

from distdoctor.models.events import Ev
from distdoctor.models.record import Frame, is_user_frame
from distdoctor.trace.cpuwait import thread_cpu_seconds
from distdoctor.trace.lines import frame_line, where
from distdoctor.trace.tracer import incomplete, user_line

SAMPLE_S = 0.02  # the sampler's period: 50 looks a second, each a few microseconds
# frames of torch.distributed (its collectives, a group's set-up) and of DDP's construction
# (its parameters' broadcast): a rank there waits for its peers, not in its own code
_DISTRIBUTED = os.path.join("torch", "distributed") + os.sep
_DDP_FILE = os.path.join("torch", "nn", "parallel", "distributed.py")


class _State:
    """The main thread's open spans (the sampler counts only outside them), the samples of
    the step under way, keyed (line, function), and how to undo the recording."""

    def __init__(self) -> None:
        self.depth = 0
        self.counts: dict[tuple[str, str, str], int] = {}  # (line, function, via) -> samples
        self.loop: Any = None  # the code object of the function that steps the optimiser
        self.user: dict[str, bool] = {}  # file -> is it the user's (cached)
        self.stopped = threading.Event()
        self.undo: list[Callable[[], None]] = []

    def patch(self, owner: Any, name: str, replacement: Any) -> None:
        original = getattr(owner, name)
        setattr(owner, name, replacement)
        self.undo.append(lambda: setattr(owner, name, original))


class Recording:
    """The phase recorder installed: ``undo()`` puts torch back as it was and stops the
    sampler (a rank records for its whole life; the overhead bench alternates)."""

    def __init__(self, tracer: Any, state: _State) -> None:
        self._tracer, self._state = tracer, state

    def undo(self) -> None:
        self._state.stopped.set()
        for step in reversed(self._state.undo):
            step()
        self._tracer.phases = None


def record_phases(tracer: Any) -> Recording:
    """Time loader waits, DDP forwards, backwards and optimiser steps on this rank, and
    sample its own code in between (see the module's docstring)."""
    tracer.count_optimizer_steps()
    state = _State()
    tracer.phases = state
    _time_loader(tracer, state)
    _time_ddp_forward(tracer, state)
    _time_backward(tracer, state)
    _time_optimizer(tracer, state)
    main = threading.main_thread().ident
    sampler = threading.Thread(target=_sample, args=(state, main), name="distdoctor-sampler",
                               daemon=True)
    sampler.start()
    # stopped before the interpreter tears down: a daemon thread still waking while torch's
    # process groups are destroyed at exit made gloo abort ("terminate called without an
    # active exception") in 3 of 8 healthy 4-rank runs that plain torchrun ended cleanly
    atexit.register(_stop_sampler, state, sampler)
    return Recording(tracer, state)


def _stop_sampler(state: _State, sampler: threading.Thread) -> None:
    state.stopped.set()
    sampler.join(timeout=1.0)


def _write(tracer: Any, kind: str, start: float, step: int, where: str,
           cpu: tuple[float, float] | None = None) -> None:
    clock = f',"cr":{cpu[0]!r},"cw":{cpu[1]!r}' if cpu is not None else ""
    tracer.put(f'{{"ev":"{Ev.PHASE}","k":"{kind}","t0":{start!r},"t1":{time.monotonic()!r},'
               f'"s":{step},"where":{json.dumps(where)}{clock}}}')


def _span(tracer: Any, state: _State, kind: str, original: Any) -> Any:
    """``original`` wrapped: its time on the main thread written as a phase."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return original(*args, **kwargs)
        start, step = time.monotonic(), tracer.optimizer_steps
        state.depth += 1
        try:
            return original(*args, **kwargs)
        finally:
            state.depth -= 1
            try:
                _write(tracer, kind, start, step, user_line())
            # Reported as incomplete evidence, below; evidence is best effort: never break the step.
            except Exception as exc:  # noqa: BLE001
                incomplete("where each rank's time goes", exc)

    setattr(timed, "__wrapped__", original)  # noqa: B010 (as functools.wraps sets it)
    return timed


def _time_loader(tracer: Any, state: _State) -> None:
    from torch.utils.data import dataloader

    iterator = dataloader._BaseDataLoaderIter
    state.patch(iterator, "__next__", _span(tracer, state, "loader", iterator.__next__))


def _time_ddp_forward(tracer: Any, state: _State) -> None:
    from torch.nn.parallel import DistributedDataParallel

    state.patch(DistributedDataParallel, "forward",
                _span(tracer, state, "forward", DistributedDataParallel.forward))


def _time_backward(tracer: Any, state: _State) -> None:
    import torch.autograd

    state.patch(torch.autograd, "backward",
                _span(tracer, state, "backward", torch.autograd.backward))


def _time_optimizer(tracer: Any, state: _State) -> None:
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    began: list[float] = []

    def before(*_: Any) -> None:
        if threading.current_thread() is threading.main_thread():
            began.append(time.monotonic())
            state.depth += 1
            if state.loop is None:  # the training loop: the user's code that steps
                found = _user_frame(state, sys._getframe(1), through=True)[0]
                state.loop = found.f_code if found is not None else ()  # (): none

    def after(*_: Any) -> None:
        # the step counter's own post hook was registered first, and has counted this step
        if threading.current_thread() is not threading.main_thread() or not began:
            return
        state.depth -= 1
        try:
            step = tracer.optimizer_steps - 1
            _write(tracer, "optimizer", began.pop(), step, user_line(), thread_cpu_seconds())
            flush_samples(tracer, step)
        except Exception as exc:  # noqa: BLE001 (reported as incomplete evidence, below)
            incomplete("where each rank's time goes", exc)

    handles = [register_optimizer_step_pre_hook(before),
               register_optimizer_step_post_hook(after)]
    state.undo += [handle.remove for handle in handles]


def flush_samples(tracer: Any, step: int | None = None) -> None:
    """Write the samples taken since the last flush as step ``step`` (by default the one
    under way): at each optimiser step's end, and at the job's end."""
    state = tracer.phases
    if state is None or not state.counts:
        return
    counts, state.counts = state.counts, {}
    lines = [[where, function, n, via] for (where, function, via), n in counts.items()]
    tracer.write(ev=Ev.GAP_SAMPLES, s=tracer.optimizer_steps if step is None else step,
                 period=SAMPLE_S, lines=lines)


def _sample(state: _State, main: int | None) -> None:
    """The sampler's loop (see the module's docstring); never raises."""
    while not state.stopped.wait(SAMPLE_S):
        if state.depth or main is None:
            continue
        try:
            frame = sys._current_frames().get(main)
            found = _user_line(state, frame)
        # A frame torn down while read: this sample is skipped, the next is taken.
        except Exception:  # noqa: BLE001
            continue
        if found is not None:
            state.counts[found] = state.counts.get(found, 0) + 1


def _user_line(state: _State, frame: Any) -> tuple[str, str, str] | None:
    """(file:line, function) of the innermost user frame, and the training loop's line that
    led there ("" when it is not inside the loop's function, or the loop is not known
    yet), or None when the thread is in a collective or in no code of the user's."""
    found, inside = _user_frame(state, frame)
    if found is None or inside:
        return None
    via = ""
    outer = found
    while outer is not None and state.loop:
        if outer.f_code is state.loop:
            via = where(outer.f_code.co_filename, frame_line(outer), outer.f_code.co_name) \
                if outer is not found else ""
            break
        outer = outer.f_back
    return (where(found.f_code.co_filename, frame_line(found), found.f_code.co_name),
            found.f_code.co_name, via)


def _user_frame(state: _State, frame: Any, through: bool = False) -> tuple[Any, bool]:
    """The innermost user frame from ``frame`` out, and whether a frame of
    torch.distributed was met first (the thread waits for its peers there; ``through``:
    go on past it)."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if not through and (_DISTRIBUTED in filename or filename.endswith(_DDP_FILE)):
            return None, True  # inside a collective the user's line led to
        mine = state.user.get(filename)
        if mine is None:
            mine = state.user[filename] = is_user_frame(Frame(filename, 0, ""))
        if mine:
            return frame, False
        frame = frame.f_back
    return None, False
