"""Do the ranks hold the same parameters? Spread at construction and after every step.

Data parallelism keeps one model in N copies: any spread at all means the copies differ.
Spread from construction on means the ranks never started alike (divergent init); spread
that starts later means they applied different updates (reported, with no fix of its
own: another finding says why).
"""

from __future__ import annotations

import math

from distdoctor.checks import finding, gradient_steps_on_every_rank, one_ddp, synchronised
from distdoctor.models import Finding, RunRecord
from distdoctor.models.calls import ranks_phrase
from distdoctor.models.distance import param_history, spreads

TOLERANCE = 1e-6
NAME = "param_spread"


def check(record: RunRecord) -> list[Finding]:
    if len(record.ranks) < 2:
        return []
    per_step = spreads(record)
    if not per_step:
        return _user_replicas(record)
    first = next((i for i, value in enumerate(per_step) if value > TOLERANCE), None)
    if first is None:
        return []
    histories = [param_history(record, r.rank) for r in record.ranks]
    differ = [r.rank for r, h in zip(record.ranks, histories)
              if h[first].digest != histories[0][first].digest]
    measured = {"spread_per_step": list(per_step), "first_divergent_step": first,
                "ranks_differing_from_rank_0": differ, "tolerance": TOLERANCE}
    trail = ", ".join(f"{value:.3g}" for value in per_step)
    if first == 0:
        return [finding(
            "divergent-init", NAME, f"spread {per_step[0]:.3g} at step 0",
            f"parameters differ across ranks right after construction: spread "
            f"{per_step[0]:.3g} at step 0 (limit {TOLERANCE:g}); {ranks_phrase(differ)} differ "
            f"from rank 0; spread per step: {trail}",
            {"knobs.broadcast_params_at_start": True}, differ, measured,
            kind="divergent-parameters", first_step=first)]
    return [Finding(
        check=NAME, fault="divergent-updates",
        symptom=f"the ranks started identical but diverge from step {first}: spread "
                f"{per_step[first]:.3g} (limit {TOLERANCE:g}); {ranks_phrase(differ)} differ "
                f"from rank 0; spread per step: {trail}",
        cause=f"the ranks applied different updates at step {first}: their gradients were "
              f"not synchronised to the same values",
        fix="see the other findings for why the gradient synchronisation failed",
        fix_changes={}, ranks=tuple(differ), measured=measured,
        headline=f"spread {per_step[first]:.3g} from step {first}",
        kind="divergent-parameters", first_step=first)]


def _user_replicas(record: RunRecord) -> list[Finding]:
    """A user's script: ranks that replicate one model (one DistributedDataParallel over
    all of them, or, unwrapped, ranks whose gradients went through one synchronisation:
    a hand-written all-reduce over the group, seen as each rank applying a multiple of the
    mean of the ranks' own gradients) must hold the same sampled parameters, taken just
    before each step. Replicas are defined by how the model is wrapped and synchronised,
    not by what each rank applied: DDP ranks that applied different gradients
    (micro-batches left unsynchronised) and ranks that clipped the synchronised gradient
    apart are still replicas, and parting is exactly what is wrong with them. Ranks whose
    gradients never met (pipeline stages, tensor-parallel shards, independent models) are
    not replicas and are never compared; from the first synchronised step on, they are."""
    trail, first, differ, where = [], None, [], ""
    every = gradient_steps_on_every_rank(record)
    sampled = [steps for steps in every if all(s.applied is not None for s in steps)]
    wrapped = one_ddp(record)
    replicas = wrapped or (synchronised(sampled[0]) if sampled else False)
    for steps in every:
        if all(s.applied is not None for s in steps):
            replicas = replicas or synchronised(steps)
        elif any(s.applied is not None for s in steps):
            continue  # ranks that sampled different steps: not one SPMD loop
        if not replicas or any(s.params is None for s in steps):
            continue
        if len({len(s.params.values) for s in steps}) != 1:
            continue
        if not all(math.isfinite(v) for s in steps for v in s.params.values):
            continue  # NaN or Inf: ``non_finite`` reports it, a spread means nothing
        spread = max(max(column) - min(column) for column in zip(*(s.params.values
                                                                   for s in steps)))
        trail.append(spread)
        if first is None and spread > TOLERANCE:
            first, where = steps[0].step, steps[0].where
            differ = [r.rank for r, s in zip(record.ranks, steps)
                      if s.params.values != steps[0].params.values]
    if first is None:
        return []
    measured = {"first_divergent_step": first, "spread": max(trail),
                "spread_per_step": trail, "ranks_differing_from_rank_0": differ,
                "tolerance": TOLERANCE, "where": where}
    if first == 1:
        return [finding(
            "divergent-init", NAME, f"spread {trail[0]:.3g} before step 1",
            f"the replicas' parameters differ before their first optimiser step (at "
            f"{where}): spread {trail[0]:.3g} (limit {TOLERANCE:g}) though they replicate "
            f"one model; {ranks_phrase(differ)} "
            f"{'differs' if len(differ) == 1 else 'differ'} from rank 0",
            {"knobs.broadcast_params_at_start": True}, differ, measured,
            fix="broadcast rank 0's parameters once the model is built (for p in "
                "model.parameters(): dist.broadcast(p.data, src=0)), or wrap the model "
                "in DistributedDataParallel, which does; or seed every rank alike",
            kind="divergent-parameters", first_step=first, where=where)]
    though = "they replicate one DDP model" if wrapped else "their gradients are " \
        "synchronised"
    return [Finding(
        check=NAME, fault="divergent-updates",
        symptom=f"the replicas started identical but differ from optimiser step {first} (at "
                f"{where}): spread {max(trail):.3g} (limit {TOLERANCE:g}) though {though}; "
                f"{ranks_phrase(differ)} "
                f"{'differs' if len(differ) == 1 else 'differ'} from rank 0",
        cause=f"the ranks updated the same parameters differently before step {first}",
        fix="make every rank apply the same update: the same optimiser and learning rate "
            "on every rank, and no rank skipping or adding a step",
        fix_changes={}, ranks=tuple(differ), measured=measured,
        headline=f"spread {max(trail):.3g} from step {first}",
        kind="divergent-parameters", first_step=first, where=(where,) if where else ())]

