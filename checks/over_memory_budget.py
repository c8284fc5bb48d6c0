"""Does every rank's training state fit its memory budget? Measured bytes against budget.

Ranks record the bytes they hold of parameters, gradients, optimiser state and gathered
layers (from the tensors' storage) and the budget they have. A rank over budget has run
out of memory. The fix is the cheapest change the planner finds that fits: a higher stage
of the same family of strategies on the same ranks, or else the fewest ranks, at the
lowest stage that fits there; the planner counts the run's optimiser in fp32 (the
precision these runs train in), each layer's worst-case shard padding and Adam's step
counters, as the measured-against-formula table does.
"""

from __future__ import annotations

from distdoctor.checks import finding
from distdoctor.memory.measured import fp32, model_of
from distdoctor.memory.planner import cheapest_fit
from distdoctor.models import Finding, MemoryEvidence, RunRecord
from distdoctor.models.calls import ranks_phrase
from distdoctor.models.strategies import family_of

NAME = "over_memory_budget"
STAGES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}


def check(record: RunRecord) -> list[Finding]:
    over: dict[int, MemoryEvidence] = {}
    for rank in record.ranks:
        first = next((m for m in rank.evidence.memory if m.budget and m.total > m.budget), None)
        if first is not None:
            over[rank.rank] = first
    if not over:
        return []
    worst_rank, worst = max(over.items(), key=lambda item: item[1].total)
    budget, stage, n = worst.budget, worst.stage, worst.world_size
    optimizer = record.spec.optimizer_name
    option = cheapest_fit(model_of(worst, optimizer), stage, n, fp32(optimizer), budget)
    measured = {"budget_bytes": budget, "stage": stage, "world_size": n,
                "bytes_per_rank": {str(r): m.total for r, m in sorted(over.items())},
                "states": {"params": worst.params, "grads": worst.grads,
                           "optimizer": worst.optimizer, "gathered": worst.gathered}}
    symptom = (f"{ranks_phrase(over)} over the memory budget of {budget} bytes "
               f"({budget / worst.model_params:g} per parameter) at step {worst.step}: "
               f"rank {worst_rank} holds {worst.total} bytes (parameters {worst.params}, "
               f"gradients {worst.grads}, optimiser {worst.optimizer}, gathered "
               f"{worst.gathered}) at {STAGES[stage]} on {n} ranks, "
               f"{worst.total / budget - 1:.0%} over")
    headline = f"{worst.total} B held, budget {budget} B"
    family = family_of(record.spec.strategy)
    if family is None:
        return [finding("over-memory-budget", check=NAME, headline=headline, symptom=symptom,
                        fix_changes={}, ranks=sorted(over),
                        measured=measured, fix=f"{record.spec.strategy} has no ZeRO stages to move "
                                      f"up: hold less per rank (more ranks to share the "
                                      f"model, or activation checkpointing)")]
    if option is None:
        return [finding("over-memory-budget", check=NAME, headline=headline, symptom=symptom,
                        fix_changes={}, ranks=sorted(over),
                        measured=measured,
                        fix="no ZeRO stage on any number of ranks fits this budget")]
    changes: dict = {}
    if family[option.stage] != record.spec.strategy:
        changes["strategy"] = family[option.stage]
    if option.world_size != n:
        changes["world_size"] = option.world_size
    measured["planned"] = {"stage": option.stage, "world_size": option.world_size,
                           "bytes_per_rank": round(option.bytes.total)}
    where = f"{family[option.stage]} ({STAGES[option.stage]}) on {option.world_size} ranks"
    fix = (f"run {where}: the planner puts it at {option.bytes.total:.0f} bytes per rank, "
           f"within the {budget}-byte budget"
           + ("" if option.world_size == n else
              f" (no stage fits on {n} ranks, so more ranks it is)"))
    return [finding("over-memory-budget", check=NAME, headline=headline, symptom=symptom,
                    fix_changes=changes, ranks=sorted(over),
                    measured=measured, fix=fix)]

