"""Detectors: one module per failure mode, each ``check(record) -> list[Finding]``.

A detector reads the evidence in a RunRecord and nothing else: never which fault was
injected, so it works the same on a user's own run.
"""

from __future__ import annotations

import functools
import importlib
import math
import pkgutil
from dataclasses import replace
from types import ModuleType
from typing import Literal

from distdoctor.analysis.distance import spread
from distdoctor.analysis.replicas import Replicas, replicas_of
from distdoctor.models import Call, CauseKind, Evidence, Finding, GroupTensor, RunRecord
from distdoctor.models.calls import REDUCING

# a mean's entry this small beside its largest is rounding, not a position to compare at
NOT_ZERO = 1e-3


def detectors() -> list[ModuleType]:
    """Every module in this package that defines ``check``, in name order."""
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if callable(getattr(module, "check", None)):
            found.append(module)
    return found


def run_all(record: RunRecord) -> tuple[Finding, ...]:
    """Every detector's findings; those that carry a fix first (a finding without one, such
    as parameters that parted, reports a consequence another finding explains)."""
    found = [finding for module in detectors() for finding in module.check(record)]
    return tuple(sorted(found, key=lambda f: not f.fix_changes))


@functools.cache
def _declaring(flag: str) -> frozenset[str]:
    """The NAMEs of the detectors whose module sets ``flag`` (read once: the package does
    not change while we run)."""
    return frozenset(module.NAME for module in detectors()
                     if getattr(module, flag, False) and hasattr(module, "NAME"))


def judges_time(check: str) -> bool:
    """Does the detector named ``check`` (its NAME, or the kind it reports: one name per
    failure mode, tests/test_names.py) judge how long ranks take, so that a busy machine
    can leave it undecided? Its module says so with ``JUDGES_TIME``."""
    return check.replace("-", "_") in _declaring("JUDGES_TIME")


def confirmed_by_a_second_run(check: str) -> bool:
    """Does the detector named ``check`` (as for ``judges_time``) judge time from one
    run's steps, so that its alarm stands only once a second run raises it too
    (``faultloop.runspec.run_decided``, and the exercises' grader)? Its module says so
    with ``CONFIRMED_BY_A_SECOND_RUN``."""
    return check.replace("-", "_") in _declaring("CONFIRMED_BY_A_SECOND_RUN")


def finding(fault_id: str, *, check: str, headline: str, symptom: str, fix_changes: dict,
            ranks=(), measured: dict | None = None, cause: str | None = None,
            fix: str | None = None, inconclusive: bool = False,
            kind: CauseKind | Literal[""] = "",
            first_step: int | None = None, where: str | None | tuple[str, ...] = ()
            ) -> Finding:
    """A finding for a catalogued failure mode, with its cause and fix text. ``kind``,
    ``first_step`` and ``where``: see Finding (``where``: one line or several; empty ones
    are dropped)."""
    from distdoctor import faults

    fault = faults.get(fault_id)
    return Finding(check=check, fault=fault_id, symptom=symptom,
                   cause=cause or fault.cause, fix=fix or fault.fix,
                   fix_changes=fix_changes, ranks=tuple(ranks), measured=measured or {},
                   headline=headline, inconclusive=inconclusive, kind=kind,
                   first_step=first_step, where=lines(where))


def one_ddp(record: RunRecord) -> bool:
    """Does every rank report one DistributedDataParallel over all of them? Then they are
    replicas, by how the model is wrapped, whatever they did since."""
    groups = {tuple(r.evidence.ddp_group) for r in record.ranks}
    return len(groups) == 1 and set(next(iter(groups))) == {r.rank for r in record.ranks}


def replica_groups(structure: list[Replicas], present: set[int]) -> set[tuple[int, ...]]:
    """The replica groups the ranks' structure names, of their members in this record,
    two ranks or more each."""
    groups = {tuple(m for m in s.group if m in present) for s in structure}
    return {g for g in groups if len(g) > 1}


def replica_parts(record: RunRecord) -> list[RunRecord]:
    """The record split by replica group (analysis/replicas.py: the ranks each rank's
    gradients are reduced with) where the ranks' communication names groups smaller than
    the job, each part holding one group's ranks alone, so that a check of replicas
    compares them within their group and never across shards; else the record whole."""
    present = {r.rank for r in record.ranks}
    groups = replica_groups([replicas_of(r.evidence) for r in record.ranks], present)
    if not groups or groups == {tuple(sorted(present))}:
        return [record]
    return [replace(record, ranks=tuple(r for r in record.ranks if r.rank in group))
            for group in sorted(groups)]


def lines(where: str | None | tuple[str, ...]) -> tuple[str, ...]:
    """A finding's ``where`` from one line, several, or none."""
    found = (where,) if isinstance(where, str) or where is None else where
    return tuple(line for line in found if line)


def steps_on_every_rank(record: RunRecord) -> list[list]:
    """Per step that every rank completed: each rank's StepEvidence, in rank order."""
    by_rank = [{s.step: s for s in r.evidence.steps} for r in record.ranks]
    common = set.intersection(*(set(steps) for steps in by_rank)) if by_rank else set()
    return [[steps[n] for steps in by_rank] for n in sorted(common)]


def gradient_steps_on_every_rank(record: RunRecord) -> list[list]:
    """Per optimiser step every rank sampled in a user's script: each rank's
    GradientEvidence, in rank order."""
    by_rank = [{g.step: g for g in r.evidence.gradients} for r in record.ranks]
    common = set.intersection(*(set(steps) for steps in by_rank)) if by_rank else set()
    return [[steps[n] for steps in by_rank] for n in sorted(common)]


def group_disagreements(record: RunRecord, kind: str) -> list[dict]:
    """Per step, the tensors of ``kind`` that a tensor-parallel group must hold alike and
    does not: step, name, group, the largest difference between two ranks' values, the
    ranks differing from the group's first, and the user's line. In step order."""
    held: dict[tuple, dict[int, GroupTensor]] = {}
    for rank in record.ranks:
        for t in rank.evidence.group_tensors:
            if t.kind == kind and t.alike and len(t.group) > 1:
                held.setdefault((t.step, t.name, t.group), {})[rank.rank] = t
    found = []
    for (step, name, group), by_rank in sorted(held.items()):
        if len(by_rank) < 2 or len({t.value.numel for t in by_rank.values()}) != 1:
            continue  # a rank that never got there, or shapes that do not compare
        first = by_rank[min(by_rank)]
        differ = [r for r, t in sorted(by_rank.items()) if t.value.digest != first.value.digest]
        if differ:
            found.append({"step": step, "name": name, "group": list(group),
                          "spread": spread([t.value for t in by_rank.values()]),
                          "ranks": differ, "where": first.where})
    return found


def first_input_parted(record: RunRecord) -> tuple[dict, GroupTensor | None] | None:
    """The first column-parallel layer's replicated input that a tensor-parallel group
    disagrees on (a ``group_disagreements`` entry), with the nearest tensor before it in
    the same forward that the group agreed on (None when it is the forward's first);
    None when no input parts, or something the group shares parted first: at an earlier
    step, or a row-parallel output in the same forward (their own checks explain it)."""
    found = group_disagreements(record, "input")
    if not found:
        return None
    first = found[0]
    step = first["step"]
    if any(d["step"] < step or (kind == "activation" and d["step"] == step)
           for kind in ("activation", "input", "parameter", "mask")
           for d in group_disagreements(record, kind)):
        return None
    held = held_in_forward(record, step, tuple(first["group"]))
    if len(held) < 2:
        return None
    order = held[min(held)]
    at = next((i for i, t in enumerate(order) if t.kind == "input" and t.name == first["name"]),
              None)
    if at is None:
        return None  # the lowest rank never recorded it: no forward order to read
    for t in reversed(order[:at]):
        copies = [next((u for u in ts if u.kind == t.kind and u.name == t.name), None)
                  for ts in held.values()]
        if all(c is not None and c.value.digest == t.value.digest for c in copies):
            return first, t
    return first, None


def held_in_forward(record: RunRecord, step: int,
                    group: tuple[int, ...]) -> dict[int, list[GroupTensor]]:
    """Each rank's row-parallel outputs and column-parallel inputs of ``group`` at
    ``step``, in the order recorded (the forward's)."""
    return {rank.rank: [t for t in rank.evidence.group_tensors
                        if t.step == step and t.group == group
                        and t.kind in ("activation", "input")]
            for rank in record.ranks if rank.rank in group}


def largest_per_step(found: list[dict]) -> dict[str, float]:
    """The largest spread of ``group_disagreements``' entries at each step, by step (as
    JSON keys, in step order)."""
    per_step: dict[int, float] = {}
    for d in found:
        per_step[d["step"]] = max(per_step.get(d["step"], 0.0), d["spread"])
    return {str(step): value for step, value in sorted(per_step.items())}


# bytes per element of the floating-point dtypes gradients are reduced in
FLOAT_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


def float_reductions(evidence: Evidence, ranks: set[int]) -> list[Call]:
    """The rank's floating-point reductions over a group holding ``ranks``, with the
    optimiser steps done before each (what a gradient sync is made of, whatever tensor
    it reduced: a flattened copy of the gradients too)."""
    return [c for c in evidence.calls if c.op in REDUCING and c.step is not None
            and c.dtype in FLOAT_BYTES and ranks <= set(c.group)]


def reduced_bytes(call: Call) -> int:
    """The bytes a reduction combined: its largest tensor (a reduce-scatter's input)."""
    return max((math.prod(shape) for shape in call.shapes), default=0) * FLOAT_BYTES.get(
        call.dtype, 0)


def reduced_together(record: RunRecord) -> dict[int, float]:
    """For each optimiser step (numbered as gradient samples are), the fewest
    floating-point elements any rank of ``record`` reduced over a group holding them all
    after the step before: whatever tensors they were (a flattened copy of the gradients
    too); unbounded for a forward of a DDP over them that syncs in its backward (DDP
    reduces every gradient, in C++, where no Python call is traced). Replicas are known
    from how ranks communicate: gradients that agree with no reduction of their size
    between the ranks agree by coincidence (the same batch, a bias's gradient on a
    constant input), not by a sync; a loss all-reduced for logging is no such one."""
    ranks = {r.rank for r in record.ranks}
    fewest: dict[int, float] | None = None
    for r in record.ranks:
        mine: dict[int, float] = {}
        for c in float_reductions(r.evidence, ranks):
            step = (c.step or 0) + 1  # (float_reductions keeps stepped calls only)
            mine[step] = mine.get(step, 0) + reduced_bytes(c) // FLOAT_BYTES[c.dtype]
        if ranks <= set(r.evidence.ddp_group):
            mine |= {f.steps_before + 1: math.inf for f in r.evidence.ddp_forwards if f.sync}
        fewest = mine if fewest is None else {
            step: min(n, mine[step]) for step, n in fewest.items() if step in mine}
    return fewest or {}


def synchronised(steps: list, reduced: dict[int, float]) -> bool:
    """Did the ranks' sampled gradients at one optimiser step (GradientEvidence each, in rank
    order) go through one synchronisation? Every rank reduced as many elements as its
    gradients hold together with the others before it (``reduced``, from
    reduced_together), and each applied a positive multiple of the mean of the ranks' own
    gradients: 1 when averaged, N when summed, another factor when a rank clipped or
    scaled it after the sync. Replicas by how they are synchronised, whatever each did
    after: ranks that train apart apply their own gradients, which are no multiple of a
    common one. Needs two positions at least where the mean is not zero (one value is a
    multiple of anything)."""
    if not steps or any(s.local is None or s.applied is None for s in steps):
        return False
    if reduced.get(steps[0].step, 0) < max(s.local.numel for s in steps):
        return False
    if len({len(s.local.values) for s in steps} | {len(s.applied.values) for s in steps}) != 1:
        return False
    mean = [sum(column) / len(steps) for column in zip(*(s.local.values for s in steps))]
    if not all(math.isfinite(m) for m in mean):
        return False
    scale = max((abs(m) for m in mean), default=0.0)
    if sum(abs(m) > NOT_ZERO * scale for m in mean) < 2 or not scale:
        return False
    return all(factor(s.applied.values, mean) is not None for s in steps)


def factor(applied: tuple[float, ...], mean: list[float]) -> float | None:
    """The positive factor ``applied`` is of ``mean`` (least squares), or None when it is
    no multiple of it: off anywhere by more than 1e-4 of its largest value (float sums
    taken in another order differ by less)."""
    c = sum(a * m for a, m in zip(applied, mean)) / sum(m * m for m in mean)
    if not math.isfinite(c) or c <= 0:
        return None
    limit = 1e-4 * c * max(abs(m) for m in mean)
    if any(abs(a - c * m) > limit for a, m in zip(applied, mean)):
        return None
    return c
