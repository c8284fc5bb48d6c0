"""Failure modes: one module per fault, each declaring a ``FAULT``.

A fault flips RunSpec knobs and nothing else (``inject`` refuses any other change), so
the same detectors judge injected runs and users' own runs alike. ``scenario`` sets up
the workload the fault needs to show at all (two epochs, several micro-batches): it is
applied to both the faulty run and the fixed one.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable

from distdoctor.models import CauseKind, RunSpec, apply_changes
from distdoctor.models.verdict import ResumeCause


@dataclass(frozen=True)
class Variant:
    name: str
    description: str
    knobs: dict[str, Any]  # dotted paths under "knobs." -> faulty value


@dataclass(frozen=True)
class Fault:
    id: str
    title: str  # the symptom as a user first meets it
    strategies: tuple[str, ...]
    symptom: str
    cause: str
    fix: str
    variants: tuple[Variant, ...]  # the first is the default
    scenario: Callable[[RunSpec], RunSpec] = field(default=lambda spec: spec)
    masked_by: dict[str, str] = field(default_factory=dict)  # strategy -> why it cannot occur
    excluded: dict[str, str] = field(default_factory=dict)  # strategy -> why it does not apply
    min_world_size: int = 1  # fewer ranks cannot show it (e.g. one node holds them all)
    # the cause a user's own run with this bug is told (a run report's kind, or what
    # resume-check names): the fault's own name, or a broader one that covers its cousins
    # too (a cycle of blocked sends, samples two ranks read); () when only the built-in
    # workload shows it
    reported_as: tuple[CauseKind | ResumeCause, ...] = ()

    def __post_init__(self) -> None:
        for variant in self.variants:
            bad = [path for path in variant.knobs if not path.startswith("knobs.")]
            if bad:
                raise ValueError(f"fault {self.id} may only flip knobs, not {bad}")

    def variant(self, name: str | None = None) -> Variant:
        if name is None:
            return self.variants[0]
        for variant in self.variants:
            if variant.name == name:
                return variant
        raise ValueError(f"fault {self.id} has no variant {name!r}; "
                         f"choose from {', '.join(v.name for v in self.variants)}")

    def inject(self, spec: RunSpec, variant: str | None = None) -> RunSpec:
        return apply_changes(spec, self.variant(variant).knobs)

    def detectable_on(self, strategy: str) -> bool:
        return strategy in self.strategies and strategy not in self.masked_by


RESTART_AFTER = 3  # mid-epoch at 2 and 4 ranks, with steps left to show what was lost


def restarted(spec: RunSpec) -> RunSpec:
    """The scenario of the resume faults: the job checkpoints and restarts after step 3,
    with what makes each part of its state matter afterwards: Adam (optimiser state), a
    decaying learning rate (a scheduler), inputs jittered from each rank's own RNG, and
    steps enough after the restart."""
    knobs = dataclasses.replace(spec.knobs, restart_after=RESTART_AFTER, lr_decay=0.7,
                                input_jitter=0.5)
    return dataclasses.replace(spec, optimizer="adam", num_steps=max(spec.num_steps, 6),
                               knobs=knobs)


def catalogue() -> dict[str, Fault]:
    """Every fault module's FAULT, by id, in file-name order."""
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        fault = getattr(importlib.import_module(f"{__name__}.{info.name}"), "FAULT", None)
        if isinstance(fault, Fault):
            found[fault.id] = fault
    return found


def get(fault_id: str) -> Fault:
    faults = catalogue()
    if fault_id not in faults:
        raise ValueError(f"unknown fault {fault_id!r}; choose from {', '.join(faults)}")
    return faults[fault_id]
