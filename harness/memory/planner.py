"""What fits a memory budget: per-stage bytes, and the cheapest change that makes a plan fit.

A plan that does not fit has three ways out, tried in this order because each costs more
than the one before: a higher ZeRO stage on the same ranks (more communication), more
ranks (more hardware; also rounded up to whole nodes, as they are bought), and activation
checkpointing, which recomputes activations in backward and so frees activation memory
only: it cannot shrink the model states.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from distdoctor.memory.formulas import Precision, StageBytes, stage_bytes


@dataclass(frozen=True)
class Model:
    """What the planner needs to know about a model and its training job."""

    params: float  # P
    largest_layer: float = 0.0  # L, parameters of the largest layer (ZeRO-3 gathers it whole)
    activations: float = 0.0  # bytes of activations per rank
    layers: int = 0  # layers sharded separately: each pads its shard to a multiple of N
    counters: float = 0.0  # bytes of per-tensor optimiser scalars (Adam's step) per rank

    def at(self, stage: int, world_size: int, precision: Precision) -> StageBytes:
        """Bytes per rank, with the layers' worst-case padding and the optimiser's counters."""
        padded = self.params + self.layers * (world_size - 1)
        bytes_ = stage_bytes(stage, padded, world_size, precision,
                             self.largest_layer + (world_size - 1 if self.layers else 0),
                             self.activations)
        return StageBytes(bytes_.stage, bytes_.params, bytes_.grads,
                          bytes_.optimizer + self.counters, bytes_.gathered, bytes_.activations)


@dataclass(frozen=True)
class Option:
    """One way to fit: the stage and world size, and the bytes per rank there."""

    stage: int
    world_size: int
    bytes: StageBytes


def fits(bytes_: StageBytes, budget: float) -> bool:
    return bytes_.total <= budget


def cheapest_fit(model: Model, stage: int, world_size: int, precision: Precision,
                 budget: float, max_world_size: int = 1024) -> Option | None:
    """The cheapest change from ``stage`` on ``world_size`` ranks that fits: the smallest
    world size (from ``world_size`` up) at which some stage from ``stage`` up fits, at the
    lowest such stage; so a stage change on the same ranks if one fits."""
    for n in range(world_size, max_world_size + 1):
        for s in range(stage, 4):
            if (s, n) == (stage, world_size):
                continue
            held = model.at(s, n, precision)
            if fits(held, budget):
                return Option(s, n, held)
    return None


def smallest_world_size(model: Model, stage: int, precision: Precision, budget: float,
                        start: int = 1) -> int | None:
    """The fewest ranks at which ``stage`` fits, or None if no number of ranks would (the
    unsharded states alone exceed the budget)."""
    one, two = model.at(stage, 1, precision).total, model.at(stage, 2, precision).total
    sharded = 2 * (one - two)  # the part that divides by N
    fixed = one - sharded
    if fixed >= budget:
        return None
    n = max(start, math.ceil(sharded / (budget - fixed)) if sharded > 0 else 1)
    while not fits(model.at(stage, n, precision), budget):
        n += 1
    return n


def round_up(n: int, multiple: int) -> int:
    return math.ceil(n / multiple) * multiple
