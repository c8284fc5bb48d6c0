"""Do the ranks of a tensor-parallel group hold the same replicated parameters?

A parameter replicated across the group (a norm, a bias, a head) must get the same update
on every rank. If its copies part while everything the group shares upstream (a row-
parallel layer's output, a shared dropout mask) agreed up to then, the copies were given
different gradients: each rank's share, never summed. A disagreement upstream explains the
drift by itself and is reported by its own check instead.
"""

from __future__ import annotations

from distdoctor.checks import finding, group_disagreements, largest_per_step
from distdoctor.models import Finding, RunRecord
from distdoctor.models.calls import ranks_phrase

NAME = "replicated_param_drift"


def check(record: RunRecord) -> list[Finding]:
    drift = group_disagreements(record, "parameter")
    if not drift:
        return []
    first = drift[0]
    upstream = [d for kind in ("activation", "input", "mask")
                for d in group_disagreements(record, kind)
                if d["step"] <= first["step"]]
    if upstream:
        return []
    names = sorted({d["name"] for d in drift if d["step"] == first["step"]})
    per_step = largest_per_step(drift)
    trail = ", ".join(f"{v:.3g}" for v in per_step.values())
    at = f" (the model parallelized at {first['where']})" if first["where"] else ""
    measured = {"first_step": first["step"], "parameters": names,
                "spread_per_step": per_step,
                "group": first["group"], "ranks": first["ranks"], "where": first["where"]}
    return [finding(
        "replicated-param-drift", check=NAME,
        headline=f"{len(names)} replicated parameter{'s' if len(names) > 1 else ''} drift from "
        f"step "
        f"{first['step']}",
        symptom=f"parameters replicated across tensor-parallel group {tuple(first['group'])} "
        f"differ "
        f"after step {first['step']}{at}: {', '.join(names)}; {ranks_phrase(first['ranks'])} "
        f"{'differs' if len(first['ranks']) == 1 else 'differ'} from rank "
        f"{first['group'][0]}, while the activations the group shares "
        f"agree; largest difference per step: {trail}",
        fix_changes={"knobs.tp_sync_replicated_grads": True}, ranks=first["ranks"],
        measured=measured,
        kind="replicated-param-drift", first_step=first["step"], where=first["where"])]
