"""``assert_resumes_like_uninterrupted``: a user's checkpoint and resume, in a test, against
the same training never stopped.

The user's own ``build``, ``step``, ``save`` and ``load`` run on warm ranks twice: once
through every batch; once through the first ``at`` batches, ``save``, then as a restarted
process would (every RNG state as a fresh process has it, a new ``build()``), ``load``
and the remaining batches. Before each optimiser step each rank digests what a resume
must restore (trace/resume.py), and the same comparison as ``distdoctor resume-check``
(analysis/resume.py) names the first thing that differs.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from typing import Any, Callable

from distdoctor.models import deadlines

# torch's CPU generator's seed in a fresh process (torch.initial_seed() before any seeding)
FRESH_TORCH_SEED = 67280421310721


def assert_resumes_like_uninterrupted(build: Callable[[], tuple[Any, Any]],
                                      step: Callable[[Any, Any, Any], Any], batches: list,
                                      save: Callable[[Any, Any, str], Any],
                                      load: Callable[[Any, Any, str], Any], *, at: int,
                                      world_size: int,
                                      deadline: float = deadlines.USER_JOB_S) -> None:
    """``build()`` -> (model, optimizer), ``step(model, optimizer, batch)``, ``save(model,
    optimizer, folder)`` and ``load(model, optimizer, folder)`` are module-level functions
    of the user's; each rank steps on every batch as given (shard it in ``step`` if it
    should). The checkpoint is saved after ``at`` steps into a fresh folder every rank
    shares. Raises RankFailure naming the first step, the ranks and what was not restored
    (the parameters, the optimiser's state or settings, an RNG state, the gradients)."""
    __tracebackhide__ = True
    from distdoctor.analysis.resume import compare
    from distdoctor.testing.onrank import call
    from distdoctor.testing.ranks import cut, judge_job, run_on, sendable
    from distdoctor.testing.verdict import RankFailure

    deadline = cut(deadline)
    sendable((build, step, save, load), "build, step, save and load",
             "pass functions defined at module level")
    sendable(batches, "the batches")
    if not 0 < at < len(batches):
        raise ValueError(f"at={at}: the checkpoint must come after a step and before the "
                         f"last of the {len(batches)} batches")
    folder = tempfile.mkdtemp(prefix="distdoctor-resume-")
    try:
        traces = []
        jobs: tuple[tuple[Callable, tuple, dict], ...] = (
            (_through, (build, step, batches), {}),
            (_stopped_and_resumed, (build, step, batches, save, load, at, folder), {}))
        for job in jobs:
            result = run_on(world_size, deadline, call, *job)
            outcome = judge_job(result, deadline, "the training")
            if outcome.status != "passed":
                raise outcome.failure()
            traces.append([value[0] for value in result.values])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    whole = [tuple(t) for t in traces[0]]
    stopped = [tuple(e for e in t if e.get("part") != "resumed") for t in traces[1]]
    resumed = [tuple(e for e in t if e.get("part") == "resumed") for t in traces[1]]
    found = compare(whole, stopped, resumed, at)
    if found.kind == "not-deterministic":
        raise AssertionError(f"cannot compare the resume: {found.summary}; {found.fix}")
    if not found.ok:
        from distdoctor.testing.verdict import relative_paths

        raise RankFailure(found.kind, found.ranks, relative_paths(
            f"the resume after step {at} parts from the training never stopped:\n"
            f"{found.summary}\n  fix: {found.fix}"))


def _fresh_process_rngs() -> None:
    """Every RNG as a restarted process has it: torch's default seed, numpy's and
    Python's from the OS (a warm rank's state from earlier jobs would carry over)."""
    import numpy as np
    import torch

    torch.manual_seed(FRESH_TORCH_SEED)
    np.random.seed()
    random.seed()


def _recording(events: list[dict], part: str):
    """Digest the state before each optimiser step into ``events`` (the STATE events
    resume-check's recorder writes), numbered within ``part``."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from distdoctor.models.events import Ev
    from distdoctor.trace.resume import state_digests

    count = [0]

    def before_step(optimizer: Any, *_: Any) -> None:
        count[0] += 1
        events.append({"ev": Ev.STATE, "step": count[0], "part": part,
                       **state_digests(optimizer)})

    return register_optimizer_step_pre_hook(before_step)


def _through(build, step, batches) -> list[dict]:
    """On each rank: every batch, never stopped."""
    _fresh_process_rngs()
    events: list[dict] = []
    hook = _recording(events, "whole")
    try:
        model, optimizer = build()
        for batch in batches:
            step(model, optimizer, batch)
    finally:
        hook.remove()
    return events


def _stopped_and_resumed(build, step, batches, save, load, at, folder) -> list[dict]:
    """On each rank: ``at`` batches, the save; then as a restarted process, the load and
    the rest."""
    import inspect

    import torch.distributed as dist

    from distdoctor.models.events import Ev

    events: list[dict] = []
    _fresh_process_rngs()
    hook = _recording(events, "stopped")
    try:
        model, optimizer = build()
        for batch in batches[:at]:
            step(model, optimizer, batch)
        save(model, optimizer, folder)
        events.append({"ev": Ev.SAVE, "n": 1, "step": at, "where": _line_of(save, inspect)})
    finally:
        hook.remove()
    dist.barrier()  # every rank's checkpoint written before any rank restarts
    del model, optimizer
    _fresh_process_rngs()
    hook = _recording(events, "resumed")
    try:
        model, optimizer = build()
        load(model, optimizer, folder)
        events.append({"ev": Ev.LOAD, "part": "resumed", "where": _line_of(load, inspect)})
        for batch in batches[at:]:
            step(model, optimizer, batch)
    finally:
        hook.remove()
    return events


def _line_of(function, inspect) -> str:
    try:
        return f"{inspect.getsourcefile(function)}:{inspect.getsourcelines(function)[1]}"
    except (OSError, TypeError):  # (no source: the function's name stands for it)
        return getattr(function, "__qualname__", "?")
