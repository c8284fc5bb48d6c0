"""Do the ranks of a tensor-parallel group agree on a row-parallel layer's output?

After its all-reduce, a row-parallel layer's output is one tensor held whole on every rank
of the group. Ranks that hold different values were each handed their own partial sum:
the all-reduce never happened, and the model trains on without an error. Outputs that
part only after the group's replicated parameters (fc2's own bias among them) or shared
masks did are explained by those, which other checks report.
"""

from __future__ import annotations

from distdoctor.checks import finding, group_disagreements, largest_per_step
from distdoctor.models import Finding, RunRecord
from distdoctor.models.calls import ranks_phrase

NAME = "missing_tp_allreduce"


def check(record: RunRecord) -> list[Finding]:
    found = group_disagreements(record, "activation")
    if not found:
        return []
    first = found[0]
    earlier = [d for kind in ("parameter", "input", "mask")
               for d in group_disagreements(record, kind)
               if d["step"] < first["step"]]
    if earlier:
        return []
    layers = sorted({d["name"] for d in found if d["step"] == first["step"]})
    per_step = largest_per_step(found)
    groups = sorted({tuple(d["group"]) for d in found})
    at = f" (parallelized at {first['where']})" if first["where"] else ""
    measured = {"layer": first["name"], "layers": layers, "first_step": first["step"],
                "spread": first["spread"], "groups": [list(g) for g in groups],
                "spread_per_step": per_step,
                "ranks": first["ranks"], "where": first["where"]}
    return [finding(
        "missing-tp-allreduce", check=NAME, headline=f"{first['name']}'s output differs across its "
        f"tensor-parallel group by {first['spread']:.3g}",
        symptom=f"the output of row-parallel layer {first['name']}{at} should be the same on every "
        f"rank of tensor-parallel group {tuple(first['group'])} and is not, from step "
        f"{first['step']}: largest difference {first['spread']:.3g}; "
        f"{ranks_phrase(first['ranks'])} {'differs' if len(first['ranks']) == 1 else 'differ'} "
        f"from rank {first['group'][0]} (each holds its own partial sum)",
        fix_changes={"knobs.tp_output_allreduce": True}, ranks=first["ranks"], measured=measured,
        kind="missing-tp-allreduce", first_step=first["step"], where=first["where"])]
