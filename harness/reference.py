"""The single-process reference: what correct training on the same samples produces.

One process trains the same model from rank 0's initialisation on each step's global
batch (every rank's share, as a correct distributed sampler deals it) with a mean loss.
Correct data parallelism must land on the same parameters within float tolerance, so
the reference ignores the spec's knobs: it is what the knobs are supposed to preserve.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from harness.fingerprint import fingerprint, max_abs_diff, spread
from harness.models import Fingerprint, Knobs, ReferenceComparison, RunRecord, RunSpec
from harness.workload import batch_ids, build_model, loss_fn, make_dataset


def reference_params(spec: RunSpec) -> tuple[Fingerprint, ...]:
    """Parameter fingerprints after construction (index 0) and after every step."""
    clean = dataclasses.replace(spec, knobs=Knobs())
    model = build_model(clean, rank=0)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=clean.lr)
    x, y = make_dataset(clean)
    prints = [fingerprint(params, clean.fingerprint_values)]
    for step in range(1, clean.num_steps + 1):
        ids = [i for rank in range(clean.world_size) for i in batch_ids(clean, rank, step)]
        optimizer.zero_grad(set_to_none=True)
        out, aux = model(x[ids])
        loss_fn(out, aux, y[ids]).backward()
        optimizer.step()
        prints.append(fingerprint(params, clean.fingerprint_values))
    return tuple(prints)


def param_history(record: RunRecord, rank: int) -> tuple[Fingerprint, ...]:
    evidence = record.ranks[rank].evidence
    initial = () if evidence.initial_params is None else (evidence.initial_params,)
    return initial + tuple(s.params for s in evidence.steps)


def compare(record: RunRecord, reference: tuple[Fingerprint, ...],
            tolerance: float = 1e-5) -> ReferenceComparison:
    """Largest parameter difference from the reference, per step (0 = after construction),
    over every rank; a step some rank never reached counts as infinitely far."""
    per_step = []
    for index, expected in enumerate(reference):
        diffs = [max_abs_diff(history[index], expected) if index < len(history) else math.inf
                 for history in (param_history(record, r.rank) for r in record.ranks)]
        per_step.append(max(diffs))
    return ReferenceComparison(max(per_step), tuple(per_step), tolerance)


def spreads(record: RunRecord) -> tuple[float, ...]:
    """Parameter spread across ranks per step (0 = after construction), while all ranks ran."""
    histories = [param_history(record, r.rank) for r in record.ranks]
    common = min(len(h) for h in histories)
    return tuple(spread([h[i] for h in histories]) for i in range(common))
