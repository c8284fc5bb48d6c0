"""One graded run of a student's attempt: the record every way of running one returns (a
plain run, resume-check's, a launch script's), and what the grade and the lessons read."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Run:
    """One run of the attempt: at ``world_size`` ranks, the causes found (kind, summary)."""

    world_size: int
    finished: bool
    causes: tuple[tuple[str, str], ...]
    # timing judgements left open (the machine too busy to decide with a margin): neither
    # a pass nor a cause, so the attempt is checked again rather than graded by luck
    undecided: tuple[str, ...] = ()
    # bytes of optimiser state over all ranks per parameter element, where a budget had the
    # ranks measure their state (None: not measured): Adam holds 8, its two fp32 moments
    state_per_parameter: float | None = None
    # the nn.Dropout layers of a parallelized model every rank saw dropping (training, p > 0)
    dropouts: tuple[str, ...] = ()
