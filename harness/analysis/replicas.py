"""Which ranks hold one model, read from how they communicate: never from whether their
synchronisation worked.

A parameter's replicas are the ranks its gradient is reduced with (data parallelism), or
its values are averaged with (local SGD, model averaging). The tracer notes the storage
each reduction reduced and how many optimiser steps came before it; the gradient sampler
notes the storages of the gradients and parameters it sampled. So a rank's reduction of
its own gradient (any view of it, or DDP's bucket it is a view of) names the group that
gradient is reduced over; DDP's buckets, copied out of the gradients, are named by their
size: the reductions after the step's DDP forward whose elements add up to the gradients'.
A rank replicates a parameter over every rank its gradient meets (the groups' union: a
layer-norm weight reduced over a tensor-parallel group and then a data-parallel one is
alike on all of them), and its whole sampled model over the ranks that every parameter
meets (the intersection), so shards are never compared. A sync that fails leaves the
structure as it was: ranks that never met only because the sync was wrong are still
replicas, and their parting is the finding.

Averaging parameters after a step (a reduction of the parameters themselves, or of a flat
copy as long as all of them) makes the averaging group meet at the next step: between two
averagings they are apart on purpose, and are judged only where they meet.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from distdoctor.models.evidence import Call, Evidence, GradientEvidence


@dataclass(frozen=True)
class Replicas:
    """What one rank's communication says about the ranks that hold its model."""

    rank: int
    group: tuple[int, ...]  # the ranks every sampled parameter is replicated on; () unknown
    how: str  # what the group was read from, in words
    where: str  # the line of the reduction that says so ("" for DDP's own)
    averaged: tuple[tuple[int, tuple[int, ...]], ...] = ()  # (step, group): parameters
    # averaged over the group after that optimiser step, so they meet before the next


def gradient_reductions(evidence: Evidence) -> list[tuple[Call, GradientEvidence]]:
    """Each reduction of a sampled gradient, with the sample of the step it feeds: made
    after that step's backward began (a gradient exists only from then: a tensor reduced
    before it, freed, can leave its address to a gradient, as DDP's count of joined ranks
    under Join did) and before the step, of a storage the gradient shares."""
    samples = {g.step: g for g in evidence.gradients
               if g.grad_storages and g.t is not None and g.local is not None}
    began = _first_backward(evidence)
    found = []
    for call in evidence.calls:
        if call.step is None or not call.storages:
            continue
        sample = samples.get(call.step + 1)
        if sample is None or sample.t is None or not call.entered <= sample.t:
            continue
        if call.entered < began.get(call.step, float("-inf")):
            continue  # before any gradient of this step existed
        if set(call.storages) & set(sample.grad_storages):
            found.append((call, sample))
    return found


def replicas_of(evidence: Evidence) -> Replicas:
    """The replica structure one rank's trace shows (see the module's docstring)."""
    reductions = [c for c in evidence.calls if c.step is not None and c.storages]
    sampled = [g for g in evidence.gradients
               if g.local is not None and g.t is not None and g.grad_storages]
    per_parameter: list[frozenset[int]] = []
    how, where = "", ""
    of_grads: dict[int, list[Call]] = {}
    for call, sample in gradient_reductions(evidence):
        of_grads.setdefault(sample.step, []).append(call)
    for sample in sampled:
        at = sample.t if sample.t is not None else float("inf")
        made = [c for c in reductions if c.step == sample.step - 1 and c.entered <= at]
        by_storage: dict[int, set[int]] = {}
        for call in of_grads.get(sample.step, []):
            for storage in set(call.storages) & set(sample.grad_storages):
                by_storage.setdefault(storage, set()).update(call.group)
                if not where:
                    how, where = "gradients reduced over", call.where
        if by_storage:
            per_parameter += [frozenset(ranks) for ranks in by_storage.values()]
            continue
        bucketed = _bucket_group(evidence, made, sample)
        if bucketed:
            per_parameter.append(frozenset(bucketed))
            how = how or "DDP's gradient buckets reduced over"
    if per_parameter:
        group = tuple(sorted(frozenset.intersection(*per_parameter)))
    elif len(evidence.ddp_group) > 1:
        group, how = tuple(evidence.ddp_group), "DistributedDataParallel over"
    else:
        group = ()
    return Replicas(evidence.rank, group, how, where,
                    _averagings(evidence, reductions, sampled))


def _bucket_group(evidence: Evidence, made: list[Call],
                  sample: GradientEvidence) -> tuple[int, ...]:
    """The group whose reductions after the step's last DDP forward add up to the sampled
    gradients' elements: DDP's buckets (with any comm hook that keeps their size)."""
    if sample.local is None or not evidence.ddp_group:
        return ()
    forwards = [f.t for f in evidence.ddp_forwards
                if f.steps_before == sample.step - 1 and f.t is not None and f.sync]
    if not forwards:
        return ()
    elements: dict[tuple[int, ...], int] = {}
    for call in made:
        if call.entered >= max(forwards) and call.dtype.startswith(("float", "bfloat")):
            elements[call.group] = elements.get(call.group, 0) + _elements(call)
    matching = [group for group, n in elements.items() if n == sample.local.numel]
    return min(matching, key=len) if matching else ()


def _averagings(evidence: Evidence, reductions: list[Call],
                sampled: list[GradientEvidence]) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """(step, group) for each reduction of the parameters made after an optimiser step and
    before the next step's first DDP forward: of their own storage, or of as many elements
    as the sampled parameters hold (a flat copy, as torch's model averagers make)."""
    if not sampled:
        return ()
    numel = max(g.local.numel for g in sampled if g.local is not None)
    # the next sample's storages: memory is reused, so an older step's say nothing
    params = {g.step - 1: set(g.param_storages) for g in sampled}
    grads = {g.step - 1: set(g.grad_storages) for g in sampled}
    began = _first_backward(evidence)  # each step's first backward or DDP forward
    for f in evidence.ddp_forwards:
        if f.t is not None:
            began[f.steps_before] = min(began.get(f.steps_before, f.t), f.t)
    found = []
    for call in reductions:
        if call.step is None or call.step < 1 or set(call.storages) & grads.get(call.step, set()):
            continue
        own = bool(set(call.storages) & params.get(call.step, set()))  # in place
        flat = _elements(call) == numel and call.entered < began.get(call.step, -1.0)
        if own or flat:  # a flat copy only before the next step's work began
            found.append((call.step, call.group))
    return tuple(dict.fromkeys(found))


def _first_backward(evidence: Evidence) -> dict[int, float]:
    """When each step's first backward began (steps counted as Phase counts them)."""
    began: dict[int, float] = {}
    for phase in evidence.phases:
        if phase.kind == "backward":
            began[phase.step] = min(began.get(phase.step, phase.start), phase.start)
    return began


def _elements(call: Call) -> int:
    return prod(call.shapes[0]) if call.shapes else 0
