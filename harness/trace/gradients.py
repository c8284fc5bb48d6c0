"""The gradients of a user's script, sampled at every optimiser step: the evidence for a
gradient summed and never averaged, and for replicas whose parameters part.

Hooks only, no change to the script: the shared optimiser hooks of ``steps.py`` (one
post-accumulate-grad hook per parameter an optimiser holds, one global pre-step hook).
"""

from __future__ import annotations

import math
import sys
from array import array
from typing import Any, Iterable

import torch

from harness.models import Fingerprint, GradientEvidence
from harness.trace.steps import step_hooks
from harness.trace.tracer import user_line


def record_gradients(tracer: Any, per_param: int = 4) -> None:
    """At every optimiser step, sample each plain parameter's gradient twice, at the
    same ``per_param`` positions: as backward accumulated it (before any hand-written
    all-reduce) and as the optimiser is about to apply it. Enough to tell an averaged
    gradient (the mean of the ranks' local ones) from a summed one, at a few tensor ops
    per parameter and step. Sharded parameters (DTensor, as FSDP2 makes them) are left
    out: their gradients are shards by design."""
    local: dict[int, torch.Tensor] = {}  # id(param) -> its latest accumulated sample
    where: dict[int, torch.Tensor] = {}  # id(param) -> its sampled positions

    def positions(p: torch.Tensor) -> torch.Tensor:
        found = where.get(id(p))
        if found is None:
            found = where[id(p)] = torch.linspace(
                0, p.numel() - 1, min(per_param, p.numel())).round().long()
        return found

    def accumulated(p: torch.Tensor, grad: torch.Tensor) -> None:
        local.pop(id(p), None)  # a sample that fails is no stale sample
        local[id(p)] = torch.take(grad.detach(), positions(p))  # no copy

    def before_step(params: list[torch.Tensor]) -> None:
        # every optimiser's steps, in the order taken (the same on every rank of an
        # SPMD script); the post-step counter has not yet seen this one
        steps = tracer.optimizer_steps + 1
        seen = [p for p in params if id(p) in local and p.grad is not None
                and p.grad.layout == torch.strided]
        if not seen:
            return  # the first step, before the hooks existed, or no gradients
        mine = torch.cat([local.pop(id(p)) for p in seen])  # a parameter backward
        # leaves alone next step keeps no stale sample
        applied = torch.cat([torch.take(p.grad.detach(), positions(p)) for p in seen])
        values = torch.cat([torch.take(p.detach(), positions(p)) for p in seen])
        # as float64 bytes in hex: exact, and 30x cheaper to write than JSON's float reprs
        rows = torch.stack([mine, applied, values]).to(torch.float64).cpu().numpy()
        tracer.write(ev="grads", step=steps, rows=rows.astype("<f8").tobytes().hex(),
                     numel=sum(p.numel() for p in seen), where=user_line())

    hooks = step_hooks(tracer)
    hooks.accumulated.append(accumulated)
    hooks.before_step.append(before_step)


def fold_gradients(events: Iterable[dict]) -> tuple[GradientEvidence, ...]:
    """Each sampled optimiser step's local and applied gradients."""
    def print_of(values: list[float], numel: int) -> Fingerprint:
        return Fingerprint(numel, repr(values), math.sqrt(sum(v * v for v in values)),
                           tuple(values))

    found = []
    for e in events:
        if e.get("ev") != "grads":
            continue
        if "rows" in e:
            local, applied, params = _rows(e["rows"])
        else:  # written before the rows were packed
            local, applied, params = e["local"], e["applied"], e.get("params")
        found.append(GradientEvidence(
            e["step"], print_of(local, e["numel"]), print_of(applied, e["numel"]),
            None if params is None else print_of(params, e["numel"]), e.get("where", "")))
    return tuple(found)


def _rows(text: str) -> list[list[float]]:
    """The three sample rows (local, applied, params) from their little-endian float64 hex."""
    values = array("d", bytes.fromhex(text))
    if sys.byteorder == "big":
        values.byteswap()
    width = len(values) // 3
    return [values[i * width:(i + 1) * width].tolist() for i in range(3)]
