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
from distdoctor.models.strategies import USER_SCRIPT, family_of

NAME = "over_memory_budget"
STAGES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}
MOST_RANKS = 4096  # the largest job the user's fix proposes


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
    measured = {"budget_bytes": budget, "stage": stage, "world_size": n,
                "bytes_per_rank": {str(r): m.total for r, m in sorted(over.items())},
                "states": {"params": worst.params, "grads": worst.grads,
                           "optimizer": worst.optimizer, "gathered": worst.gathered}}
    symptom = (f"{ranks_phrase(over)} over the memory budget of {budget} bytes "
               f"({budget / worst.model_params:.3g} per parameter) at step {worst.step}: "
               f"rank {worst_rank} holds {worst.total} bytes (parameters {worst.params}, "
               f"gradients {worst.grads}, optimiser {worst.optimizer}, gathered "
               f"{worst.gathered}) at {STAGES[stage]} on {n} ranks, "
               f"{worst.total / budget - 1:.0%} over")
    headline = f"{worst.total} B held, budget {budget} B"

    def said(fix: str, changes: dict | None = None, where: tuple[str, ...] = ()) -> list:
        return [finding("over-memory-budget", check=NAME, kind="over-memory-budget",
                        headline=headline, symptom=symptom, fix_changes=changes or {},
                        ranks=sorted(over), measured=measured, fix=fix, where=where)]

    if record.spec.strategy == USER_SCRIPT:  # told in torch's words, at its optimiser's line
        fix, planned = torch_fix(worst, _partitioned_state(record, worst))
        if planned:
            measured["planned"] = planned
        built = next((o.built for r in record.ranks if r.rank == worst_rank
                      for o in r.evidence.optimizer if o.built), "")
        return said(fix, where=(built,) if built else ())
    family = family_of(record.spec.strategy)
    if family is None:
        return said(f"{record.spec.strategy} has no ZeRO stages to move up: hold less per "
                    f"rank (more ranks to share the model, or activation checkpointing)")
    optimizer = record.spec.optimizer_name
    option = cheapest_fit(model_of(worst, optimizer), stage, n, fp32(optimizer), budget)
    if option is None:
        return said("no ZeRO stage on any number of ranks fits this budget")
    changes: dict = {}
    if family[option.stage] != record.spec.strategy:
        changes["strategy"] = family[option.stage]
    if option.world_size != n:
        changes["world_size"] = option.world_size
    measured["planned"] = {"stage": option.stage, "world_size": option.world_size,
                           "bytes_per_rank": round(option.bytes.total)}
    where = f"{family[option.stage]} ({STAGES[option.stage]}) on {option.world_size} ranks"
    return said(f"run {where}: the planner puts it at {option.bytes.total:.0f} bytes per "
                f"rank, within the {budget}-byte budget"
                + ("" if option.world_size == n else
                   f" (no stage fits on {n} ranks, so more ranks it is)"), changes)


def whole_optimizer_state(record: RunRecord, step: int | None = None) -> int | None:
    """The whole model's optimiser state in bytes at ``step`` (by default the first step
    the ranks measured): one rank's where every rank holds it whole (stage 0), every rank's
    part added up where it is partitioned (stage 1) or sharded (stage 3); None where a rank
    measured none at that step."""
    if step is None:
        step = min((m.step for r in record.ranks for m in r.evidence.memory), default=0)
    parts = [next((m for m in r.evidence.memory if m.step == step), None)
             for r in record.ranks]
    if not parts or any(m is None for m in parts):
        return None
    held = [m for m in parts if m is not None]
    if held[0].stage == 0:
        return held[0].optimizer
    return sum(m.optimizer for m in held) if len(held) == held[0].world_size else None


def _partitioned_state(record: RunRecord, held: MemoryEvidence) -> int | None:
    """The whole optimiser state of a partitioned run (stage 1), every rank's partition
    added up; None where a rank's is missing or the state is not partitioned."""
    return whole_optimizer_state(record, held.step) if held.stage == 1 else None


def torch_fix(held: MemoryEvidence, whole_state: int | None = None) -> tuple[str, dict]:
    """The cheapest change of a user's script that fits its budget, in torch's words, from
    the bytes its rank measured (trace/memory.py): the optimiser's state partitioned
    (``ZeroRedundancyOptimizer``, ZeRO-1) on the same ranks, else the parameters sharded
    too (``fully_shard``, FSDP2) on the same ranks, else on the fewest ranks that fit. A
    partition of whole tensors is uneven, so a rank is counted its share plus the
    largest tensor's; a sharded model's rows split evenly (the layer it gathers for a
    forward is working memory, as activations are, not the state measured).
    ``whole_state``: a partitioned run's optimiser state over all its ranks (else this
    rank's times the ranks). Returns the fix and what it plans ({} when nothing fits)."""
    n, budget = held.world_size, held.budget
    scale = {0: (1, 1, 1), 1: (1, 1, n)}.get(held.stage, (n, n, n))  # back to whole
    params, grads, state = (b * k for b, k in zip((held.params, held.grads, held.optimizer),
                                                  scale))
    if whole_state is not None:
        state = whole_state
    largest = held.largest_layer / held.model_params if held.model_params else 1.0

    def zero1(ranks: int) -> float:
        return params + grads + state / ranks + state * largest

    def fsdp(ranks: int) -> float:  # rows split evenly; a gathered layer is not state
        return (params + grads + state) / ranks

    options = []
    if held.stage == 0:
        options.append(("wrap the optimiser in torch.distributed.optim."
                        "ZeroRedundancyOptimizer (ZeRO-1: each rank keeps its partition's "
                        "optimiser state)", 1, n, zero1(n)))
    if held.stage < 3:
        options.append(("shard the model with fully_shard (FSDP2, ZeRO-3: parameters, "
                        "gradients and optimiser state sharded)", 3, n, fsdp(n)))
    more = next((r for r in range(n + 1, MOST_RANKS + 1) if fsdp(r) <= budget), None)
    if more is not None:
        options.append((f"shard the model with fully_shard (FSDP2, ZeRO-3) on {more} ranks: "
                        f"on {n} no stage fits", 3, more, fsdp(more)))
    for words, stage, ranks, need in options:
        if need <= budget:
            return (f"{words}: about {need:.0f} bytes per rank at most, within the "
                    f"{budget}-byte budget", {"stage": stage, "world_size": ranks,
                                              "bytes_per_rank": round(need)})
    return (f"no ZeRO stage on up to {MOST_RANKS} ranks fits {budget} bytes per rank: hold "
            f"less (a smaller model, or lower-precision optimiser state)", {})
