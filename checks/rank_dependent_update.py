"""Do the replicas apply one update? Same gradient, same settings, same optimiser state.

Replicas (one DDP over every rank, or gradients that went through one synchronisation)
stay one model only if every rank turns the synchronised gradient into the same update.
Three ways they do not, each read from the ranks' own evidence, earliest first:

- a setting of the optimiser differs: the learning rate after a ``scheduler.step()``
  run on some ranks only, or a setting changed under ``if rank == 0``;
- the gradient applied is the synchronised one scaled by a factor that differs by rank:
  clipping (``clip_grad_norm_``) or scaling on some ranks only, after the sync;
- the optimiser's state differs while the parameters agree: momentum or Adam's moments
  loaded from a checkpoint on some ranks only.

The parameters parting is the bare invariant (divergent_parameters); this names why.
"""

from __future__ import annotations

from collections import Counter

from distdoctor.checks import (
    factor,
    gradient_steps_on_every_rank,
    one_ddp,
    reduced_together,
    replica_parts,
    synchronised,
)
from distdoctor.models import Finding, OptimizerEvidence, RunRecord
from distdoctor.models.calls import ranks_phrase, relative_line

NAME = "rank_dependent_update"
TOLERANCE = 1e-6  # relative to the values' size
NAMES = {"lr": "learning rate", "weight_decay": "weight decay", "momentum": "momentum",
         "betas[0]": "beta1", "betas[1]": "beta2", "eps": "eps", "max_lr": "max_lr"}


def check(record: RunRecord) -> list[Finding]:
    """Within each replica group: ranks of different groups may update apart."""
    found = [f for part in replica_parts(record) for f in _check(part)]
    return [min(found, key=lambda f: f.first_step or 0)] if found else []


def _check(record: RunRecord) -> list[Finding]:
    if len(record.ranks) < 2:
        return []
    every = gradient_steps_on_every_rank(record)
    reduced = reduced_together(record)
    if not (one_ddp(record) or any(synchronised(steps, reduced) for steps in every)):
        return []  # not replicas: ranks that train apart may update apart
    found = [f for f in (_settings(record), _scaled(record, every, reduced), _state(record))
             if f]
    return [min(found, key=lambda f: f.first_step or 0)] if found else []


def _odd_ones(values: list, ranks: list[int]) -> list[int]:
    """The ranks outside a strict majority of equal values; with none, those unlike the
    lowest rank."""
    counts = Counter(values)
    common, n = counts.most_common(1)[0]
    if n * 2 <= len(values):
        common = values[0]
    return [r for r, v in zip(ranks, values) if v != common]


# -- a setting of the optimiser ----------------------------------------------------------

def _settings(record: RunRecord) -> Finding | None:
    ranks = [r.rank for r in record.ranks]
    per_rank = [_by_optimizer(r.evidence.optimizer) for r in record.ranks]
    numbers = set.intersection(*(set(p) for p in per_rank))
    last = min(max([e.step for e in r.evidence.optimizer] +
                   [g.step for g in r.evidence.gradients], default=0)
               for r in record.ranks)  # steps every rank took
    for number in sorted(numbers):
        series = [p[number] for p in per_rank]
        if len({(s[-1].params, s[-1].numel) for s in series}) != 1:
            continue  # not the same optimiser on every rank
        for step in sorted({e.step for s in series for e in s if e.step <= last}):
            found = [_in_effect(s, step) for s in series]
            now = [e for e in found if e is not None]
            if len(now) < len(found) or len({e.settings for e in now}) == 1:
                continue
            return _settings_finding(record, ranks, number, step, series, now)
    return None


def _by_optimizer(events: tuple[OptimizerEvidence, ...]) -> dict[int, list]:
    found: dict[int, list] = {}
    for e in events:
        found.setdefault(e.optimizer, []).append(e)
    return found


def _in_effect(series: list[OptimizerEvidence], step: int) -> OptimizerEvidence | None:
    before = [e for e in series if e.step <= step]
    return before[-1] if before else None


def _settings_finding(record, ranks, number, step, series, now) -> Finding:
    changed = _changed(ranks, step, series, now)
    differ = changed or _odd_ones([e.settings for e in now], ranks)
    parted: dict[str, list] = {}
    for group, pairs in enumerate(zip(*(e.settings for e in now))):
        for key in sorted({k for pair in pairs for k, _ in pair}):
            values = [dict(pair).get(key) for pair in pairs]
            if len(set(values)) > 1:
                name = NAMES.get(key, key) + (f" of parameter group {group}" if group else "")
                parted.setdefault(name, values)
    name, values = next(iter(parted.items()))
    each = ", ".join(f"{_number(v)} on {ranks_phrase(rs)}"
                     for v, rs in _ranks_by_value(values, ranks))
    # a scheduler's line the odd ranks stepped and the others did not
    others = {e.scheduled for r, e in zip(ranks, now) if r not in differ}
    scheduled = sorted({relative_line(e.scheduled) for r, e in zip(ranks, now)
                        if r in differ and e.scheduled and e.scheduled not in others})
    step_line = relative_line(now[0].where) if now[0].where else ""
    built = sorted({relative_line(e.built) for r, e in zip(ranks, now)
                    if r in differ and e.built}) if not changed else []
    lines = scheduled + built + ([step_line] if step_line else [])
    if scheduled:
        cause = (f"a learning-rate scheduler stepped on {ranks_phrase(differ)} only, at "
                 f"{', '.join(scheduled)}, runs ahead of the other ranks' schedule")
        fix = (f"call scheduler.step() at {scheduled[0]} on every rank (out of any "
               f"`if rank == 0:` block), once per optimiser step")
    elif changed:
        cause = (f"an optimiser setting changed on {ranks_phrase(differ)} only, as a "
                 f"param_groups entry set under a rank condition does")
        fix = ("change the optimiser's settings alike on every rank: set param_groups "
               "entries, or step a scheduler, outside any rank condition")
    else:
        cause = (f"the optimiser was built with other settings on {ranks_phrase(differ)}"
                 + (f" at {', '.join(built)}" if built else "") +
                 ": a setting computed from the rank, or from the rank's own data")
        fix = ("build the optimiser with the same settings on every rank"
               + (f" at {built[0]}" if built else "") + ": compute them from what every "
               "rank shares (the global batch size, the world size), not the rank's own "
               "share")
    return _update(
        headline=f"{name} differs from step {step}",
        symptom=f"the replicas' optimiser settings differ from optimiser step {step}: "
                f"{name} {each}: {cause}, so the same gradient becomes a different "
                f"update and the replicas part",
        cause=cause, fix=fix, ranks=differ, step=step, where=lines,
        measured={"first_step": step, "setting": name, "optimizer": number,
                  "values": {str(r): v for r, v in zip(ranks, values)},
                  "scheduled": scheduled})


def _changed(ranks: list[int], step: int, series: list, now: list) -> list[int]:
    """The ranks whose settings changed at ``step`` from what every rank had before it
    (the odd ones out even at two ranks: the rank that moved, not the one that stayed)."""
    found = [_in_effect(s, step - 1) for s in series]
    before = [e for e in found if e is not None]
    if len(before) < len(found) or len({e.settings for e in before}) != 1:
        return []
    changed = [r for r, e, b in zip(ranks, now, before) if e.settings != b.settings]
    return changed if len(changed) < len(ranks) else []


def _ranks_by_value(values: list, ranks: list[int]) -> list[tuple]:
    found: dict = {}
    for v, r in zip(values, ranks):
        found.setdefault(v, []).append(r)
    return list(found.items())


def _number(value) -> str:
    return "unset" if value is None else f"{value:.6g}"


# -- a gradient scaled on some ranks -----------------------------------------------------

def _scaled(record: RunRecord, every: list, reduced: dict[int, float]) -> Finding | None:
    ranks = [r.rank for r in record.ranks]
    for steps in every:
        if any(s.applied is None or s.params is None for s in steps):
            continue
        if len({len(s.params.values) for s in steps}) != 1 or \
                not _close([s.params.values for s in steps]):
            return None  # the replicas parted before: whatever follows, not the first
        if len({s.applied.values for s in steps}) == 1:
            continue
        mean = [sum(c) / len(steps) for c in zip(*(s.local.values for s in steps))]
        found = [factor(s.applied.values, mean) for s in steps] \
            if synchronised(steps, reduced) else []
        factors = [f for f in found if f is not None]
        if not factors or len(factors) < len(found):
            return None  # not one gradient scaled: the gradients themselves differ
        rounded = [round(f, 4) for f in factors]
        if len(set(rounded)) == 1:
            continue
        step = steps[0].step
        clipped_by = {r: relative_line(e.clipped) for r, rank in zip(ranks, record.ranks)
                      for e in rank.evidence.optimizer if e.step == step and e.clipped}
        differ = (sorted(clipped_by) if 0 < len(clipped_by) < len(ranks) else
                  [r for r, f in zip(ranks, rounded) if f != 1.0]
                  if 1.0 in rounded else _odd_ones(rounded, ranks))
        clipped = sorted({clipped_by[r] for r in differ if r in clipped_by})
        where = relative_line(steps[0].where) if steps[0].where else ""
        each = ", ".join(f"{v:.4g}x on {ranks_phrase(rs)}"
                         for v, rs in _ranks_by_value(rounded, ranks))
        if clipped:
            cause = (f"the gradient is clipped on {ranks_phrase(differ)} only, at "
                     f"{', '.join(clipped)}, after the synchronisation")
            fix = (f"clip on every rank (clip_grad_norm_ at {clipped[0]} out of any rank "
                   f"condition): after the sync every rank then scales by the same factor")
        else:
            cause = (f"the gradient is scaled on {ranks_phrase(differ)} only after the "
                     f"synchronisation, by clipping, loss scaling or a division by a count "
                     f"that differs by rank")
            fix = ("scale or clip the gradient alike on every rank, after the sync, or "
                   "before it on every rank's own gradient")
        return _update(
            headline=f"gradient scaled apart at step {step}",
            symptom=f"optimiser step {step} applied the synchronised gradient (the mean of "
                    f"the ranks' own gradients, sampled) times {each}: {cause}, so the "
                    f"replicas take different updates from identical parameters",
            cause=cause, fix=fix, ranks=differ, step=step,
            where=clipped + ([where] if where else []),
            measured={"first_step": step, "factors": {str(r): f for r, f in
                                                       zip(ranks, rounded)},
                      "clipped": clipped})
    return None


# -- the optimiser's state ---------------------------------------------------------------

def _state(record: RunRecord) -> Finding | None:
    ranks = [r.rank for r in record.ranks]
    per_rank = [_by_optimizer(r.evidence.optimizer) for r in record.ranks]
    numbers = set.intersection(*(set(p) for p in per_rank))
    for number in sorted(numbers):
        by_step = [{e.step: e for e in p[number] if e.sampled_params} for p in per_rank]
        for step in sorted(set.intersection(*(set(s) for s in by_step))):
            now = [s[step] for s in by_step]
            if len({(e.params, e.numel, len(e.sampled_params)) for e in now}) != 1:
                break  # not the same optimiser on every rank
            if not _close([e.sampled_params for e in now]):
                break  # the parameters parted first: that is what to explain
            names = [tuple(name for name, _ in e.state) for e in now]
            if len(set(names)) != 1:  # state some ranks hold and others do not
                parted = sorted(set().union(*names) - set.intersection(*map(set, names)))
                holders = [r for r, n in zip(ranks, names) if parted[0] in n]
                differ = holders if len(holders) * 2 <= len(ranks) else \
                    [r for r in ranks if r not in holders]
                detail = (f"{parted[0]} held by {ranks_phrase(holders)} only, not by "
                          f"{ranks_phrase([r for r in ranks if r not in holders])}")
            else:
                parted = [name for i, name in enumerate(names[0])
                          if len({len(e.state[i][1]) for e in now}) == 1
                          and not _close([e.state[i][1] for e in now])]
                if not parted:
                    continue  # alike, or not yet made on any rank (or never: plain SGD)
                at = names[0].index(parted[0])
                differ = _odd_ones([tuple(e.state[at][1]) for e in now], ranks)
                detail = (f"{', '.join(parted)}: {ranks_phrase(differ)} "
                          f"{'holds' if len(differ) == 1 else 'hold'} other values")
            where = relative_line(now[0].where) if now[0].where else ""
            loaded = sorted({relative_line(e.loaded) for r, e in zip(ranks, now) if e.loaded})
            if loaded:
                cause = (f"the optimiser's state is loaded at {', '.join(loaded)} on some "
                         f"ranks only, or from different checkpoints")
                fix = (f"load the optimiser's state dict at {loaded[0]} on every rank (or "
                       f"broadcast it from rank 0 after loading)")
            else:
                cause = ("an optimiser state that differs by rank: set on some ranks only, "
                         "or made before the replicas were synchronised")
                fix = ("give every rank the same optimiser state: load it on every rank, "
                       "and build the optimiser after the model's parameters are alike")
            return _update(
                headline=f"optimiser state differs at step {step}",
                symptom=f"the replicas' optimiser state differs before optimiser step "
                        f"{step} though their parameters agree ({detail}): {cause}, so "
                        f"the same gradient becomes a different update",
                cause=cause, fix=fix, ranks=differ, step=step,
                where=loaded + ([where] if where else []),
                measured={"first_step": step, "state": parted, "optimizer": number})
    return None


def _update(*, headline: str, symptom: str, cause: str, fix: str, ranks: list[int],
            step: int, where: list[str], measured: dict) -> Finding:
    """The finding of an update that differs by rank: one kind, each way with its text."""
    return Finding(check=NAME, fault="rank-dependent-update", kind="rank-dependent-update",
                   headline=headline, symptom=symptom, cause=cause, fix=fix, fix_changes={},
                   ranks=tuple(ranks), first_step=step, where=tuple(where), measured=measured)


def _close(rows: list[tuple[float, ...]]) -> bool:
    for column in zip(*rows):
        size = max(1.0, max(abs(v) for v in column))
        if max(column) - min(column) > TOLERANCE * size:
            return False
    return True
