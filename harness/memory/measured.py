"""Measured bytes per rank against the formula for the rank's ZeRO stage.

The runs train in fp32, so the formula is fp32's (4 bytes of parameters, 4 of gradients,
and Adam's 8 of m and v, or SGD's 0), sharded as the stage says. Two things the formula
leaves out are stated rather than hidden: every layer's flat buffer is padded to a
multiple of N (at most N - 1 elements a layer, so the formula gives a range), and Adam
keeps one 4-byte step counter per tensor it steps (counted exactly). torch's own
strategies lay state out differently (ZeroRedundancyOptimizer by whole tensors, FSDP2 by
padded rows) and the comparison shows by how much.
"""

from __future__ import annotations

from dataclasses import dataclass

from distdoctor.memory.formulas import Precision
from distdoctor.memory.planner import Model
from distdoctor.models import MemoryEvidence, RunRecord
from distdoctor.text import wrap

STAGE_FORMULAS = {0: "4P + 4P + kP", 1: "4P + 4P + kP/N", 2: "4P + 4P/N + kP/N",
                  3: "4P/N + 4P/N + kP/N + 8L"}


@dataclass(frozen=True)
class FormulaComparison:
    low: int  # the formula with no padding
    high: int  # with every layer padded by N - 1 elements
    measured: int

    @property
    def within(self) -> bool:
        return self.low <= self.measured <= self.high


def fp32(optimizer: str) -> Precision:
    return Precision("fp32", 4, 4, 0, 8 if optimizer == "adam" else 0, "")


def model_of(memory: MemoryEvidence, optimizer: str, padded: bool = True) -> Model:
    """What the planner needs to know about a measured run: its parameters, largest layer,
    the layers that pad their shards (``padded``) and Adam's step counters."""
    return Model(memory.model_params, memory.largest_layer,
                 layers=memory.layers if padded else 0,
                 counters=4 * memory.optimizer_tensors if optimizer == "adam" else 0)


def formula_range(memory: MemoryEvidence, optimizer: str) -> tuple[int, int]:
    """Total bytes the formula gives for this rank's stage, without and with padding
    (none at stage 0: nothing is sharded), plus Adam's step counters."""
    n, precision = memory.world_size, fp32(optimizer)
    low, high = (model_of(memory, optimizer, padded).at(memory.stage, n, precision)
                 for padded in (False, bool(memory.stage)))
    return round(low.total), round(high.total)


def compare(memory: MemoryEvidence, optimizer: str) -> FormulaComparison:
    low, high = formula_range(memory, optimizer)
    return FormulaComparison(low, high, memory.total)


def memory_table(record: RunRecord) -> str | None:
    """Each rank's bytes at its last step, state by state, against the stage's formula."""
    last = [(r.rank, r.evidence.memory[-1]) for r in record.ranks if r.evidence.memory]
    if not last:
        return None
    optimizer = record.spec.optimizer_name
    first = last[0][1]
    k = 8 if optimizer == "adam" else 0
    lines = [wrap(f"memory per rank in bytes, measured from tensor storage, against the fp32 "
             f"formula for stage {first.stage} on {first.world_size} ranks: "
             f"{STAGE_FORMULAS[first.stage].replace('k', str(k))} with P = "
             f"{first.model_params}, L = {first.largest_layer}"
             + (f", plus Adam's step counters; the range allows each of {first.layers} "
                f"layers' padding" if first.stage else "")),
             f"{'rank':>4}  {'params':>7}  {'grads':>7}  {'optimizer':>9}  {'gathered':>8}  "
             f"{'total':>7}  formula"]
    for rank, m in last:
        result = compare(m, optimizer)
        span = f"{result.low}" if result.low == result.high else f"{result.low}-{result.high}"
        bound = result.high if result.measured > result.high else result.low
        verdict = "within" if result.within else \
            f"{result.measured - bound:+d} ({result.measured / bound - 1:+.0%})"
        lines.append(f"{rank:>4}  {m.params:>7}  {m.grads:>7}  {m.optimizer:>9}  "
                     f"{m.gathered:>8}  {m.total:>7}  {span} {verdict}")
    return "\n".join(lines)
