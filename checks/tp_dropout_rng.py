"""Are the dropout masks of a tensor-parallel group shared where they must be, and
independent where they must be?

A mask on an activation the group holds whole (after a row-parallel layer's all-reduce)
must be the same on every rank, or the copies of one activation are dropped differently.
A mask on a sharded activation (a column-parallel layer's slices) must differ between
slices: identical masks on every slice, step after step, are far past chance (given the
share the masks keep, the chance is printed) and mean every rank drew from one RNG state.
"""

from __future__ import annotations

import math

from distdoctor.checks import finding, group_disagreements
from distdoctor.models import Finding, GroupTensor, RunRecord
from distdoctor.models.calls import ranks_phrase

NAME = "tp_dropout_rng"
CHANCE = 1e-9  # identical independent masks this likely or more are left alone


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
            measured=measured,
            first_step=first["step"], where=first["where"])]
    same = _identical_slices(record)
    if not same:
        return []
    name, group, steps, log_chance = same
    measured = {"mask": name, "group": list(group), "steps_identical": steps,
                "log10_chance_if_independent": log_chance}
    return [finding(
        "tp-dropout-rng", check=NAME, headline=f"{name}: every slice gets the same mask",
        symptom=f"the {name} mask, on an activation split across tensor-parallel group "
        f"{tuple(group)}, is the same on every slice at all {steps} steps; independent "
        f"masks would agree this often with chance 1e{log_chance:.0f}",
        fix_changes={"knobs.tp_dropout_rng": "tracked"}, ranks=group[1:], measured=measured,
        cause="every rank draws the sharded activation's dropout from the same RNG state, "
              "so each slice is dropped at the same positions and the slices are not "
              "independent")]


def _identical_slices(record: RunRecord):
    """(mask, group, steps, log10 chance) of sharded masks identical on every rank at
    every step, when that is rarer than CHANCE; else None."""
    held: dict[tuple, dict[int, dict[int, GroupTensor]]] = {}
    for rank in record.ranks:
        for t in rank.evidence.group_tensors:
            if t.kind == "mask" and not t.alike and len(t.group) > 1:
                held.setdefault((t.name, t.group), {}).setdefault(t.step, {})[rank.rank] = t
    for (name, group), steps in sorted(held.items()):
        complete = [by_rank for by_rank in steps.values() if len(by_rank) == len(group)]
        if not complete or any(len({t.value.digest for t in by_rank.values()}) > 1
                               for by_rank in complete):
            continue
        values = [v for by_rank in complete for t in by_rank.values() for v in t.value.values]
        kept = sum(1 for v in values if v) / len(values)
        agree = kept * kept + (1 - kept) * (1 - kept)
        if agree >= 1.0:
            continue  # nothing dropped (or everything): no mask to tell apart
        numel = sum(len(next(iter(by_rank.values())).value.values) * (len(group) - 1)
                    for by_rank in complete)
        log_chance = numel * math.log10(agree)
        if log_chance < math.log10(CHANCE):
            return name, group, len(complete), log_chance
    return None
