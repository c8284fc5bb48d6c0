"""What a resumed run must carry over, recorded at each optimiser step: for
``distdoctor resume-check``, which compares a run resumed from its own checkpoint with the
same run never stopped.

Before each optimiser step a rank writes a digest of each thing a resume must restore:
the parameters and their gradients, the optimiser's state and settings (the learning
rate), the RNG states (torch's CPU generator, numpy's, Python's ``random``), and the
epoch each DistributedSampler was last told. Digests, not values: equal digests mean
bitwise equal state, and a step costs a pass over the parameters' bytes, which is why
this runs only under resume-check (``RESUME_ENV`` set), never in ``run``.

It also notes the calls that save and restore: each ``torch.save`` (and
``torch.distributed.checkpoint.save``) and ``torch.load``, and each RNG state set, with the
user's line. ``STOP_ENV``=K: once any rank's K-th save returned, the file ``MARK_ENV``
names is made, and every rank stops at its next optimiser step (the interruption
resume-check makes, as a crash would): the ranks that save at that step have all saved,
and no rank steps past the checkpoint.
"""

from __future__ import annotations

import hashlib
import os
import random
from typing import Any, Callable

import numpy as np
import torch

from distdoctor.models.events import Ev
from distdoctor.trace.tracer import incomplete, user_line

RESUME_ENV = "DISTDOCTOR_RESUME"  # set: record the state at each step
STOP_ENV = "DISTDOCTOR_RESUME_STOP"  # K: stop after the K-th save
MARK_ENV = "DISTDOCTOR_RESUME_MARK"  # the file that tells every rank to stop
LIMIT_ENV = "DISTDOCTOR_RESUME_LIMIT"  # N: stop once N steps are done (resume-check --steps)


def record_resume(tracer: Any) -> None:
    """Install the state digests and the save/load notes, when resume-check asked."""
    if not os.environ.get(RESUME_ENV):
        return
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from distdoctor.trace.steps import step_hooks

    step_hooks(tracer)  # the step counter, shared with the other recorders
    stop_after = int(os.environ.get(STOP_ENV, "0") or 0)
    limit = int(os.environ.get(LIMIT_ENV, "0") or 0)
    mark = os.environ.get(MARK_ENV, "")
    saves = [0]

    def before_step(optimizer: Any, *_: Any) -> None:
        if limit and tracer.optimizer_steps >= limit or \
                mark and os.path.exists(mark) and tracer.optimizer_steps >= _step_in(mark):
            # the K-th checkpoint is written after this rank's last step: stop here, as a
            # crash would, every rank at the same step (its other savers saved too)
            tracer.write(ev=Ev.STOPPED, step=tracer.optimizer_steps)
            os._exit(0)
        try:
            tracer.write(ev=Ev.STATE, step=tracer.optimizer_steps + 1,
                         **state_digests(optimizer))
        except Exception as exc:  # noqa: BLE001 (evidence is best effort: said incomplete)
            incomplete("the state digests of each step", exc)

    register_optimizer_step_pre_hook(before_step)

    def stopping(step: int) -> None:
        """After this rank's K-th save: every rank stops once past this step."""
        saves[0] += 1
        if stop_after and saves[0] == stop_after and mark:
            with open(f"{mark}.{os.getpid()}", "w") as note:  # whole, then in place at
                note.write(str(step))  # once: a reader never sees it half written
            os.replace(f"{mark}.{os.getpid()}", mark)

    for module, name, kind in _checkpoint_calls():
        setattr(module, name, _noted(tracer, getattr(module, name), kind,
                                     f"{module.__name__}.{name}",
                                     stopping if kind == Ev.SAVE else None, saves))
    _note_rng_restores(tracer)


def _checkpoint_calls() -> list[tuple[Any, str, str]]:
    """(module, function, event) of each call that saves or loads a checkpoint."""
    calls: list[tuple[Any, str, str]] = [(torch, "save", Ev.SAVE), (torch, "load", Ev.LOAD)]
    try:
        import torch.distributed.checkpoint as dcp

        calls += [(dcp, "save", Ev.SAVE), (dcp, "load", Ev.LOAD)]
    except ImportError:  # (a torch built without distributed: no DCP to note)
        pass
    return calls


def _noted(tracer: Any, original: Callable, kind: str, what: str,
           after: Callable[[int], None] | None, saves: list[int]) -> Callable:
    """``original``, its call noted with the user's line: a load as it starts, a save once
    it returned (numbered, then ``after``: the stop that follows the K-th)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        if kind == Ev.LOAD:
            tracer.write(ev=kind, what=what, step=tracer.optimizer_steps,
                         path=_path_of(args, kwargs), where=user_line())
            return original(*args, **kwargs)
        result = original(*args, **kwargs)
        tracer.write(ev=kind, n=saves[0] + 1, what=what, step=tracer.optimizer_steps,
                     path=_path_of(args, kwargs), where=user_line())
        if after is not None:
            after(tracer.optimizer_steps)
        return result
    return call


def _step_in(mark: str) -> int:
    """The step the checkpoint was written after (a rank still before it goes on)."""
    try:
        with open(mark) as note:
            return int(note.read())
    except (OSError, ValueError):  # (unreadable: no rank stops on it)
        return 1 << 62


def state_digests(optimizer: Any) -> dict[str, Any]:
    """Each thing a resume restores, as a short digest (bitwise equal, equal digest)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = []
    for p in params:
        for key, value in sorted(optimizer.state.get(p, {}).items()):
            state.append((key, value))
    grads = [p.grad for p in params if p.grad is not None]
    tensors = [v for _, v in state if isinstance(v, torch.Tensor)]
    return {
        "params": _digest(p.detach() for p in params),
        "grads": _digest(grads),
        "optimizer_state": _digest(v if isinstance(v, torch.Tensor) else repr((k, v))
                                   for k, v in state),
        # a few values of each, for comparing within a tolerance where runs are not
        # bitwise alike (analysis/resume.py)
        "params_sample": _sample(params),
        "grads_sample": _sample(grads),
        "optimizer_state_sample": _sample(tensors),
        "settings": [{k: v for k, v in group.items() if k != "params"
                      and isinstance(v, (bool, int, float))} for group in optimizer.param_groups],
        "rng_torch": _digest([torch.get_rng_state()]),
        "rng_numpy": _digest([repr(np.random.get_state())]),
        "rng_python": _digest([repr(random.getstate())]),
    }


SAMPLED = 32  # values kept of each state for a comparison within a tolerance


def _sample(tensors: list) -> list[float]:
    """Up to SAMPLED values spread evenly over ``tensors`` laid end to end, as floats:
    read in place, tensor by tensor (no copy of the whole model)."""
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]  # a DTensor's
    flat = [t.detach().reshape(-1) for t in local if t.numel()]  # shard: no collective
    stride = max(1, sum(t.numel() for t in flat) // SAMPLED)
    values: list[float] = []
    start = 0  # the first index in the next tensor that falls on the stride
    for t in flat:
        if start < t.numel():
            values += t[start::stride][:SAMPLED - len(values)].double().tolist()
        start = (start - t.numel()) % stride
        if len(values) >= SAMPLED:
            break
    return values


def _digest(items) -> str:
    h = hashlib.blake2b(digest_size=8)
    for item in items:
        if isinstance(item, torch.Tensor):
            item = item.detach().cpu().contiguous()
            h.update(str(item.dtype).encode())
            h.update(item.view(torch.uint8).numpy().tobytes() if item.numel() else b"")
        else:
            h.update(str(item).encode())
    return h.hexdigest()


def _path_of(args: tuple, kwargs: dict) -> str:
    """The file a save or load names, where it is a path (a checkpoint's first argument
    that is a str or PathLike: torch.save's second, torch.load's first, DCP's
    checkpoint_id)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, (str, os.PathLike)):
            return os.fspath(value)
    return ""


def _note_rng_restores(tracer: Any) -> None:
    """Where each RNG state is set (torch, numpy, random): the restore of a resume."""
    def noted(module: Any, name: str, label: str) -> None:
        original = getattr(module, name)

        def restore(*args: Any, **kwargs: Any) -> Any:
            tracer.write(ev=Ev.RNG, what=label, step=tracer.optimizer_steps,
                         where=user_line())
            return original(*args, **kwargs)

        setattr(module, name, restore)

    noted(torch, "set_rng_state", "torch.set_rng_state")
    noted(np.random, "set_state", "numpy.random.set_state")
    noted(random, "setstate", "random.setstate")
