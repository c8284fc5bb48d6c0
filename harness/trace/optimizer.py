"""The optimiser's side of each update: its settings (learning rate, momentum, weight
decay, betas: every plain value of each parameter group) in effect at each step, and on
the sampled steps a few values of its state and of the parameters it steps.

Why: replicas that apply the same gradient still part when the update itself differs by
rank: a learning-rate schedule stepped on rank 0 only, a setting changed under
``if rank == 0``, a gradient clipped on one rank after the sync, an optimiser state
loaded on some ranks only. The parameters show that the replicas parted; this is what
says why. The lines that change the update are noted too: the last ``scheduler.step()``
the last gradient clipping of each step, each optimiser's construction and its last
``load_state_dict``, where they ran.

Cost: a settings event is written only when a setting changed (or on a sampled step);
reading the settings is a dict walk per parameter group, microseconds per step. The
state is sampled at the gradient recorder's sampled steps only (gradients.sampled).
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch

from distdoctor.analysis.positions import spread_positions
from distdoctor.models.events import Ev
from distdoctor.trace.gradients import sampled, viewable
from distdoctor.trace.tracer import incomplete, plain_params, user_line

PER_PARAM = 4  # values sampled of each state tensor and parameter
_CLIPPERS = ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm")


def settings_of(optimizer: Any) -> list[list]:
    """Each parameter group's numeric settings, as sorted [name, value] pairs: numbers and
    booleans (as 0 or 1), a 0-dim tensor's value, a sequence's items as ``name[i]``
    (Adam's betas); flags that are not numbers (``foreach``'s None) are left out."""
    groups = []
    for group in optimizer.param_groups:
        pairs: list[list] = []
        for key, value in group.items():
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                value = value.item()
            if isinstance(value, (bool, int, float)):
                pairs.append([key, float(value)])
            elif isinstance(value, (tuple, list)) and key != "params" and all(
                    isinstance(v, (bool, int, float)) for v in value):
                pairs += [[f"{key}[{i}]", float(v)] for i, v in enumerate(value)]
        groups.append(sorted(pairs, key=lambda pair: pair[0]))
    return groups


def record_optimizer(tracer: Any) -> None:
    """Write an optimiser event before each step whose settings changed or that is sampled;
    note the lines of scheduler steps and gradient clipping."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from distdoctor.trace.steps import step_hooks

    step_hooks(tracer)  # the step counter, installed before this hook: steps numbered alike
    seen: dict[str, Any] = {"job": None}
    notes: dict[str, Any] = {"scheduled": "", "clipped": ("", 0), "loaded": {}, "built": {}}

    def fresh() -> None:
        """A pool's next job numbers its optimisers anew."""
        if seen["job"] != tracer.jobs:
            seen.clear()
            seen.update(job=tracer.jobs, order={}, last={}, glance={}, where={})

    def before_step(optimizer: Any, *_: Any) -> None:
        try:
            fresh()
            step = tracer.optimizer_steps + 1
            key = id(optimizer)
            known = seen["order"].get(key)
            if known is None or known[0]() is not optimizer:
                known = seen["order"][key] = (weakref.ref(optimizer), len(seen["order"]))
                seen["last"].pop(key, None)
                seen["glance"].pop(key, None)
            sample = sampled(step)
            glance = [tuple(v for k, v in g.items() if k != "params")
                      for g in optimizer.param_groups]  # a fifth of settings_of's cost
            if not sample and glance == seen["glance"].get(key):
                return
            seen["glance"][key] = glance
            settings = settings_of(optimizer)
            if settings == seen["last"].get(key) and not sample:
                return
            seen["last"][key] = settings
            params = plain_params(optimizer)
            event: dict[str, Any] = {
                "ev": Ev.OPTIMIZER, "step": step, "optimizer": known[1],
                "params": len(params), "numel": sum(p.numel() for p in params),
                "settings": settings, "where": user_line(),
                "scheduled": notes["scheduled"]}
            for what in ("loaded", "built"):
                noted = notes[what].get(key)
                if noted is not None and noted[0]() is optimizer:
                    event[what] = noted[1]
            clipped, at = notes["clipped"]
            if clipped and at == step:
                event["clipped"] = clipped
            if sample:
                state, values = _state(optimizer, params, seen["where"])
                event["state"], event["sampled"] = state, values
            tracer.write(**event)
        # Reported as incomplete evidence, below; evidence is best effort: never break the step.
        except Exception as exc:  # noqa: BLE001
            incomplete("optimiser settings", exc)

    tracer.optimizer_hook = register_optimizer_step_pre_hook(before_step), before_step
    _note_schedulers(tracer, notes)
    _note_clipping(tracer, notes)
    _note_loading(notes)
    _note_building(notes)


def _state(optimizer: Any, params: list[torch.Tensor],
           where: dict[int, tuple]) -> tuple[dict[str, str], str]:
    """Per state entry shaped like its parameter (momentum_buffer, exp_avg, ...), the
    values at the same positions of every parameter that has it, as float64 hex; and the
    parameters' own values there."""
    rows: dict[str, list[np.ndarray]] = {}
    mine = []
    for p in params:
        found = where.get(id(p))
        if found is None or found[0]() is not p:
            flat = torch.tensor(spread_positions(p.numel(), PER_PARAM))
            found = where[id(p)] = (weakref.ref(p), flat, flat.numpy())
        at = (found[1], found[2])
        mine.append(_take(p, at))
        for name, value in optimizer.state.get(p, {}).items():
            if isinstance(value, torch.Tensor) and value.shape == p.shape and \
                    value.is_floating_point() and value.layout == torch.strided:
                rows.setdefault(name, []).append(_take(value, at))
    state = {name: np.concatenate(found).astype("<f8").tobytes().hex()
             for name, found in sorted(rows.items())}
    values = np.concatenate(mine).astype("<f8").tobytes().hex() if mine else ""
    return state, values


def _take(t: torch.Tensor, flat: tuple[torch.Tensor, np.ndarray]) -> np.ndarray:
    """The values of ``t`` at the flat positions: through a numpy view on the CPU (a
    fifth of torch.take's cost), else by torch."""
    if viewable(t):
        return t.detach().numpy().reshape(-1)[flat[1]]
    return torch.take(t.detach(), flat[0]).to(torch.float64).cpu().numpy()


def _note_schedulers(tracer: Any, notes: dict) -> None:
    """The line of each ``scheduler.step()``, for the next optimiser event."""
    from torch.optim import lr_scheduler

    base = getattr(lr_scheduler, "LRScheduler", None) or lr_scheduler._LRScheduler
    classes = [base] + _subclasses(base)
    for cls in classes:
        original = cls.__dict__.get("step")
        if original is None or getattr(original, "_distdoctor", False):
            continue

        def step(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            if tracer.optimizer_steps:  # the scheduler's own step at construction: no note
                notes["scheduled"] = user_line()
            return _original(self, *args, **kwargs)

        step._distdoctor = True  # type: ignore[attr-defined]
        setattr(cls, "step", step)  # noqa: B010 (a patch)


def _subclasses(cls: type) -> list[type]:
    found: list[type] = []
    sub: type
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_subclasses(sub))
    return found


def _note_clipping(tracer: Any, notes: dict) -> None:
    """The line of each gradient clipping, with the step it belongs to."""
    from torch.nn import utils

    for name in _CLIPPERS:
        original = getattr(utils, name, None)
        if original is None or getattr(original, "_distdoctor", False):
            continue

        def clip(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            notes["clipped"] = (user_line(), tracer.optimizer_steps + 1)
            return _original(*args, **kwargs)

        clip._distdoctor = True  # type: ignore[attr-defined]
        setattr(utils, name, clip)


def _note_loading(notes: dict) -> None:
    """The line of each optimiser's last ``load_state_dict``."""
    from torch.optim import Optimizer

    original = Optimizer.load_state_dict
    if getattr(original, "_distdoctor", False):
        return

    def load_state_dict(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        notes["loaded"][id(optimizer)] = (weakref.ref(optimizer), user_line())
        return original(optimizer, *args, **kwargs)

    load_state_dict._distdoctor = True  # type: ignore[attr-defined]
    setattr(Optimizer, "load_state_dict", load_state_dict)  # noqa: B010 (a patch)


def _note_building(notes: dict) -> None:
    """The line that built each optimiser."""
    from torch.optim import Optimizer

    original = Optimizer.__init__
    if getattr(original, "_distdoctor_built", False):
        return

    def init(optimizer: Any, *args: Any, **kwargs: Any) -> None:
        original(optimizer, *args, **kwargs)
        try:
            notes["built"][id(optimizer)] = (weakref.ref(optimizer), user_line())
        except Exception as exc:  # noqa: BLE001 (reported as incomplete evidence, below)
            incomplete("optimiser settings", exc)

    init._distdoctor_built = True  # type: ignore[attr-defined]
    setattr(Optimizer, "__init__", init)  # noqa: B010 (a patch)

