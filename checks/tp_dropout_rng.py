"""Are the dropout masks of a tensor-parallel group shared where they must be, and
independent where they must be?

A mask on an activation the group holds whole (after a row-parallel layer's all-reduce)
must be the same on every rank, or the copies of one activation are dropped differently.
A mask on a sharded activation (a column-parallel layer's slices) must differ between
slices: identical masks on every slice, step after step, are far past chance (given the
share the masks keep, the chance is printed) and mean every rank drew from one RNG state.

A user's script shows no masks, but it shows what they do. A column-parallel layer handed
its input replicated (a DTensor Replicate on every rank: its gradient is all-reduced over
the group) must be handed the same values on every rank. When an earlier layer of the same
forward was handed (or put out) values the group agreed on, and nothing the group shares
disagreed at an earlier step, the ranks drew the activation apart in between, in their own
code: a random op on each rank's own RNG state, dropout the usual one. When the difference
is the earlier layer's output times 0 or one scale, that is dropout's signature, and its
rate is measured: masks that differ.
"""

from __future__ import annotations

import math

from distdoctor.checks import finding, first_input_parted, group_disagreements, held_in_forward
from distdoctor.models import Finding, GroupTensor, RunRecord
from distdoctor.models.calls import ranks_phrase
from distdoctor.models.evidence import MASK_UNKNOWN

NAME = "tp_dropout_rng"
CHANCE = 1e-9  # identical independent masks this likely or more are left alone
CLOSE = 1e-4  # relative difference below which two sampled values count as one (float32
# sums in another order differ by about 1e-7 of the value)
SCALE_SPREAD = 1e-2  # the ratios of a dropout's differences to its input agree this well:
# a difference of two float32 sums of the residual carries that sum's rounding, about 1e-7
# of it, which is a larger share of a small input


def check(record: RunRecord) -> list[Finding]:
    differ = group_disagreements(record, "mask")
    if differ:
        first = differ[0]
        steps = sorted({d["step"] for d in differ})
        measured = {"mask": first["name"], "first_step": first["step"],
                    "steps_differing": len(steps), "group": first["group"],
                    "ranks": first["ranks"], "where": first["where"]}
        return [finding(
            "tp-dropout-rng", check=NAME,
            headline=f"{first['name']}: masks differ across the group",
            symptom=f"the {first['name']} mask, on an activation every rank of tensor-parallel "
            f"group {tuple(first['group'])} holds whole, differs from rank to rank from step "
            f"{first['step']} ({len(steps)} of the steps): {ranks_phrase(first['ranks'])} "
            f"{'drops' if len(first['ranks']) == 1 else 'drop'} other values than rank "
            f"{first['group'][0]}",
            fix_changes={"knobs.tp_dropout_rng": "tracked"}, ranks=first["ranks"],
            measured=measured, kind="tp-dropout-rng",
            first_step=first["step"], where=first["where"])]
    apart = _drawn_apart(record)
    if apart:
        return [apart]
    same = _identical_slices(record)
    if not same:
        return []
    name, group, steps, log_chance, where = same
    measured = {"mask": name, "group": list(group), "steps_identical": steps,
                "log10_chance_if_independent": log_chance, "where": where}
    return [finding(
        "tp-dropout-rng", check=NAME, headline=f"{name}: every slice gets the same mask",
        symptom=f"the {name} mask, on an activation split across tensor-parallel group "
        f"{tuple(group)}, is the same on every slice at all {steps} steps; independent "
        f"masks would agree this often with chance 1e{log_chance:.0f}",
        fix_changes={"knobs.tp_dropout_rng": "tracked"}, ranks=group[1:], measured=measured,
        kind="tp-dropout-rng", where=where,
        cause="every rank draws the sharded activation's dropout from the same RNG state, "
              "so each slice is dropped at the same positions and the slices are not "
              "independent",
        fix=None if not where else  # the built-in workload's: the catalogue's words
        "draw the dropout on an activation each rank holds a slice of from an RNG state of "
        "that rank's own (seeded by rank), and keep one state the tensor-parallel group "
        "shares for dropout on activations it holds whole, as Megatron's RNG tracker does")]


def _identical_slices(record: RunRecord):
    """(mask, group, steps, log10 chance, line) of sharded masks identical on every rank at
    every step, when that is rarer than CHANCE; else None. A position a rank could not
    read (a user's dropout handed a zero: MASK_UNKNOWN) is left out of the comparison."""
    held = _sliced(record, "mask")
    handed = _sliced(record, "dropout-input")
    for (name, group), steps in sorted(held.items()):
        if _copies(handed.get((name, group), {}), len(group)):
            continue  # every rank was handed the same values: one whole tensor, not slices
        complete = [by_rank for by_rank in steps.values() if len(by_rank) == len(group)
                    and len({t.value.numel for t in by_rank.values()}) == 1]
        compared = [column for by_rank in complete for column in
                    zip(*(t.value.values for t in by_rank.values()))
                    if MASK_UNKNOWN not in column]
        if not compared or any(len(set(column)) > 1 for column in compared):
            continue
        kept = sum(1 for column in compared if column[0]) / len(compared)
        agree = kept * kept + (1 - kept) * (1 - kept)
        if agree >= 1.0:
            continue  # nothing dropped (or everything): no mask to tell apart
        log_chance = len(compared) * (len(group) - 1) * math.log10(agree)
        if log_chance < math.log10(CHANCE):
            where = next(iter(complete[0].values())).where
            return name, group, len(complete), log_chance, where
    return None


def _sliced(record: RunRecord, kind: str) -> dict[tuple, dict[int, dict[int, GroupTensor]]]:
    """Per (name, group), per step, per rank: the tensors of ``kind`` held as slices."""
    held: dict[tuple, dict[int, dict[int, GroupTensor]]] = {}
    for rank in record.ranks:
        for t in rank.evidence.group_tensors:
            if t.kind == kind and not t.alike and len(t.group) > 1:
                held.setdefault((t.name, t.group), {}).setdefault(t.step, {})[rank.rank] = t
    return held


def _copies(steps: dict[int, dict[int, GroupTensor]], ranks: int) -> bool:
    """Was every rank handed the same values at every step it was sampled (the dropout's
    sampled inputs, where a user's run recorded them)?"""
    complete = [by_rank for by_rank in steps.values() if len(by_rank) == ranks]
    return bool(complete) and all(len({t.value.digest for t in by_rank.values()}) == 1
                                  for by_rank in complete)


def _drawn_apart(record: RunRecord) -> Finding | None:
    """The first column-parallel input the group disagrees on, drawn apart after an earlier
    tensor of the same forward that it agreed on; None when there is none, when something
    the group shares parted first (its own check explains it), or when the forward's first
    shared input already differs (tp_batches_differ)."""
    parted = first_input_parted(record)
    if parted is None:
        return None
    first, before = parted
    if before is None:
        return None
    step, group = first["step"], tuple(first["group"])
    scale = _dropout_scale(held_in_forward(record, step, group), before, first["name"])
    measured = {"layer": first["name"], "after": before.name, "first_step": step,
                "spread": first["spread"], "group": list(group), "ranks": first["ranks"],
                "dropout_rate": None if scale is None else round(1 - 1 / scale, 4),
                "where": first["where"]}
    drawn = (f"the difference is {before.name}'s output times 0 or {scale:.4g}: dropout at "
             f"rate {1 - 1 / scale:.3g} with masks that differ from rank to rank"
             if scale else "something between them drew other values on each rank")
    return finding(
        "tp-dropout-rng", check=NAME,
        headline=f"{first['name']}'s input differs across its tensor-parallel group by "
        f"{first['spread']:.3g}",
        symptom=f"at step {step}, every rank of tensor-parallel group {group} is handed the "
        f"same {before.name} {'output' if before.kind == 'activation' else 'input'}, but not "
        f"the same input to column-parallel layer {first['name']}, which the group holds "
        f"whole (largest difference {first['spread']:.3g}; {ranks_phrase(first['ranks'])} "
        f"{'differs' if len(first['ranks']) == 1 else 'differ'} from rank {group[0]}): "
        f"{drawn}",
        cause="every rank draws dropout from its own RNG state (seeded by rank, say), the "
              "dropout on activations the tensor-parallel group holds whole too, so each "
              "rank drops other values of one activation and the copies part",
        fix="draw the dropout on activations the tensor-parallel group holds whole from an "
            "RNG state the group shares (the same seed on every rank of the group), and keep "
            "per-rank seeds for dropout on sharded activations, as Megatron's RNG tracker does",
        fix_changes={"knobs.tp_dropout_rng": "tracked"}, ranks=first["ranks"],
        measured=measured, kind="tp-dropout-rng", first_step=step, where=first["where"])


def _dropout_scale(held: dict[int, list[GroupTensor]], before: GroupTensor,
                   name: str) -> float | None:
    """When every rank's input ``name`` in ``held`` (``held_in_forward``) minus the lowest
    rank's is ``before``'s values times 0, +s or -s (sampled at the same positions: the
    same size), the scale s (1 / (1 - p) for dropout at rate p); else None."""
    base = [t for t in held[min(held)] if t.kind == "input" and t.name == name]
    if not base or before.value.numel != base[0].value.numel:
        return None
    ratios = []
    for rank in sorted(held)[1:]:
        mine = next((t for t in held[rank] if t.kind == "input" and t.name == name), None)
        if mine is None:
            return None
        for a, b, y in zip(mine.value.values, base[0].value.values, before.value.values):
            if abs(a - b) <= CLOSE * max(abs(a), abs(b), 1e-30):
                continue
            if y == 0:
                return None
            ratios.append(abs(a - b) / abs(y))
    if not ratios or max(ratios) - min(ratios) > SCALE_SPREAD * max(ratios):
        return None
    return sum(ratios) / len(ratios)
