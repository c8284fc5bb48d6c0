"""The gradients of a user's script, sampled at every optimiser step: the evidence for a
gradient summed and never averaged, and for replicas whose parameters part.

Hooks only, no change to the script: a post-accumulate-grad hook on every parameter an
optimiser holds (from the optimiser's construction on) and a global pre-step hook.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from harness.models import Fingerprint, GradientEvidence
from harness.trace.tracer import plain_params, user_line


def record_gradients(tracer: Any, per_param: int = 4) -> None:
    """At every optimiser step, sample each plain parameter's gradient twice, at the
    same ``per_param`` positions: as backward accumulated it (a post-accumulate hook,
    before any hand-written all-reduce) and as the optimiser is about to apply it.
    Enough to tell an averaged gradient (the mean of the ranks' local ones) from a
    summed one, at a few tensor ops per parameter and step. Sharded parameters
    (DTensor, as FSDP2 makes them) are left out: their gradients are shards by design."""
    from torch.optim.optimizer import Optimizer, register_optimizer_step_pre_hook

    local: dict[int, torch.Tensor] = {}  # id(param) -> its latest accumulated sample
    hooked: set[int] = set()

    where: dict[int, torch.Tensor] = {}  # id(param) -> its sampled positions

    def positions(p: torch.Tensor) -> torch.Tensor:
        found = where.get(id(p))
        if found is None:
            found = where[id(p)] = torch.linspace(
                0, p.numel() - 1, min(per_param, p.numel())).round().long()
        return found

    def accumulated(p: torch.Tensor) -> None:
        try:
            if p.grad is not None and p.grad.layout == torch.strided:
                local[id(p)] = torch.take(p.grad.detach(), positions(p))  # no copy
        except Exception:  # evidence is best effort: never break the user's backward
            local.pop(id(p), None)

    def before_step(optimizer: Any, *args: Any) -> None:
        try:
            sample_step(optimizer)
        except Exception:  # evidence is best effort: never break the user's step
            pass

    def sample_step(optimizer: Any) -> None:
        params = plain_params(optimizer)
        for p in params:
            if id(p) not in hooked:
                hooked.add(id(p))
                p.register_post_accumulate_grad_hook(accumulated)
        # every optimiser's steps, in the order taken (the same on every rank of an
        # SPMD script); the post-step counter has not yet seen this one
        steps = tracer.optimizer_steps + 1
        seen = [p for p in params if p.grad is not None and id(p) in local
                and p.grad.layout == torch.strided]
        if not seen:
            return  # the first step, before the hooks existed, or no gradients
        mine = torch.cat([local.pop(id(p)) for p in seen])  # a parameter backward
        # leaves alone next step keeps no stale sample
        applied = torch.cat([torch.take(p.grad.detach(), positions(p)) for p in seen])
        values = torch.cat([torch.take(p.detach(), positions(p)) for p in seen])
        rows = torch.stack([mine, applied, values]).to(torch.float64).tolist()
        tracer.write(ev="grads", step=steps, local=rows[0], applied=rows[1],
                     params=rows[2], numel=sum(p.numel() for p in seen), where=user_line())

    tracer.count_optimizer_steps()
    register_optimizer_step_pre_hook(before_step)
    original = Optimizer.__init__

    def init(optimizer: Any, *args: Any, **kwargs: Any) -> None:
        original(optimizer, *args, **kwargs)
        try:
            for p in plain_params(optimizer):  # hooked from construction: step 1 is seen too
                if id(p) not in hooked:
                    hooked.add(id(p))
                    p.register_post_accumulate_grad_hook(accumulated)
        except Exception:
            pass

    Optimizer.__init__ = init


def fold_gradients(events: Iterable[dict]) -> tuple[GradientEvidence, ...]:
    """Each sampled optimiser step's local and applied gradients."""
    def print_of(values: list[float], numel: int) -> Fingerprint:
        return Fingerprint(numel, repr(values), math.sqrt(sum(v * v for v in values)),
                           tuple(values))

    return tuple(GradientEvidence(
        e["step"], print_of(e["local"], e["numel"]), print_of(e["applied"], e["numel"]),
        print_of(e["params"], e["numel"]) if "params" in e else None, e.get("where", ""))
        for e in events if e.get("ev") == "grads")
