"""Do the ranks hold the same parameters? Spread at construction and after every step.

Data parallelism keeps one model in N copies: any spread at all means the copies differ.
Spread from construction on means the ranks never started alike (divergent init); spread
that starts later means they applied different updates (reported, with no fix of its
own: another finding says why).
"""

from __future__ import annotations

import math

from distdoctor.analysis.distance import param_history, spreads
from distdoctor.analysis.replicas import replicas_of
from distdoctor.checks import (
    finding,
    gradient_steps_on_every_rank,
    one_ddp,
    reduced_together,
    replica_groups,
    synchronised,
)
from distdoctor.models import Finding, RunRecord
from distdoctor.models.calls import ranks_phrase

TOLERANCE = 1e-6
NAME = "divergent_parameters"


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
            "divergent-init", check=NAME, headline=f"spread {per_step[0]:.3g} at step 0",
            symptom=f"parameters differ across ranks right after construction: spread "
            f"{per_step[0]:.3g} at step 0 (limit {TOLERANCE:g}); {ranks_phrase(differ)} differ "
            f"from rank 0; spread per step: {trail}",
            fix_changes={"knobs.broadcast_params_at_start": True}, ranks=differ, measured=measured,
            kind="divergent-parameters", first_step=first)]
    return [Finding(
        check=NAME, fault="divergent-parameters",
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
    """A user's script: ranks that replicate one model must hold the same sampled
    parameters, taken just before each step. Who replicates whom is read from how the
    ranks communicate (analysis/replicas.py: the group each rank's gradients are reduced
    over, DDP's group, the groups parameters are averaged over), never from whether the
    sync worked: ranks whose sync failed are still replicas, and parting is exactly what
    is wrong with them. Groups that average their parameters now and then are judged
    where they meet, right after an averaging. Where no rank shows any structure (a sync
    through a flat copy of the gradients, say), ranks that reduced floats together before
    a step and each applied a multiple of their gradients' mean are taken as one group,
    from that step on: agreeing gradients alone are no sync (the same batch). Ranks whose
    gradients never met (pipeline stages, tensor-parallel shards, independent models)
    are never compared."""
    trail, first, differ, where = [], None, [], ""
    every = gradient_steps_on_every_rank(record)
    position = {r.rank: i for i, r in enumerate(record.ranks)}
    comparisons, though = _comparisons(record, every, position)
    base = record.ranks[0].rank
    for steps in every:
        if len({s.applied is None for s in steps}) > 1:
            continue  # ranks that sampled different steps: not one SPMD loop
        for members, judged in comparisons:
            if judged is not None and steps[0].step not in judged:
                continue
            mine = [steps[position[m]] for m in members]
            if any(s.params is None for s in mine) or \
                    len({len(s.params.values) for s in mine}) != 1:
                continue
            if not all(math.isfinite(v) for s in mine for v in s.params.values):
                continue  # NaN or Inf: ``non_finite`` reports it, a spread means nothing
            spread = max(max(column) - min(column)
                         for column in zip(*(s.params.values for s in mine)))
            trail.append(spread)
            if first is None and spread > TOLERANCE:
                first, where = steps[0].step, steps[0].where
                differ = [m for m, s in zip(members, mine)
                          if s.params.values != mine[0].params.values]
                base = members[0]
    if first is None:
        return []
    measured = {"first_divergent_step": first, "spread": max(trail),
                "spread_per_step": trail, "ranks_differing_from_rank_0": differ,
                "tolerance": TOLERANCE, "where": where}
    if first == 1:
        return [finding(
            "divergent-init", check=NAME, headline=f"spread {trail[0]:.3g} before step 1",
            symptom=f"the replicas' parameters differ before their first optimiser step (at "
            f"{where}): spread {trail[0]:.3g} (limit {TOLERANCE:g}) though they replicate "
            f"one model; {ranks_phrase(differ)} "
            f"{'differs' if len(differ) == 1 else 'differ'} from rank {base}",
            fix_changes={"knobs.broadcast_params_at_start": True}, ranks=differ, measured=measured,
            fix="broadcast rank 0's parameters once the model is built (for p in "
                "model.parameters(): dist.broadcast(p.data, src=0)), or wrap the model "
                "in DistributedDataParallel, which does; or seed every rank alike",
            kind="divergent-parameters", first_step=first, where=where)]
    return [Finding(
        check=NAME, fault="divergent-parameters",
        symptom=f"the replicas started identical but differ from optimiser step {first} (at "
                f"{where}): spread {max(trail):.3g} (limit {TOLERANCE:g}) though {though}; "
                f"{ranks_phrase(differ)} "
                f"{'differs' if len(differ) == 1 else 'differ'} from rank {base}",
        cause=f"the ranks updated the same parameters differently before step {first}",
        fix="make every rank apply the same update: the same optimiser and learning rate "
            "on every rank, and no rank skipping or adding a step",
        fix_changes={}, ranks=tuple(differ), measured=measured,
        headline=f"spread {max(trail):.3g} from step {first}",
        kind="divergent-parameters", first_step=first, where=(where,) if where else ())]



Comparison = tuple[tuple[int, ...], "frozenset[int] | None"]  # members, steps judged (None: all)


def _comparisons(record: RunRecord, every: list[list],
                 position: dict[int, int]) -> tuple[list[Comparison], str]:
    """Which ranks to compare at which steps, and why they must agree, in words."""
    structure = [replicas_of(r.evidence) for r in record.ranks]
    groups = replica_groups(structure, set(position))
    if groups:
        found: list[Comparison] = [(g, None) for g in sorted(groups)]
        meets: dict[tuple[int, ...], set[int]] = {}
        for s in structure:
            for step, group in s.averaged:
                members = tuple(m for m in group if m in position)
                if len(members) > 1 and members not in groups:
                    meets.setdefault(members, set()).add(step + 1)
        found += [(g, frozenset(steps)) for g, steps in sorted(meets.items())]
        named = next(s for s in structure if s.group)
        where = f" at {named.where}" if named.where else ""
        return found, (f"they replicate one model ({named.how} "
                       f"{ranks_phrase(list(named.group))}{where})")
    ranks = tuple(sorted(position))
    if one_ddp(record):
        return [(ranks, None)], "they replicate one DDP model"
    reduced = reduced_together(record)
    first = next((steps[0].step for steps in every if synchronised(steps, reduced)), None)
    if first is None:
        return [], ""
    return [(ranks, frozenset(steps[0].step for steps in every
                              if steps[0].step >= first))], "their gradients are synchronised"
