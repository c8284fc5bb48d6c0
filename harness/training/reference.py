"""The single-process reference: what correct training on the same samples produces.

One process trains the same model from rank 0's initialisation, each step on every rank's
share of the global batch (as a correct distributed sampler deals it), minimising the mean
of the per-rank losses: the objective data parallelism is meant to optimise, with the
optimiser the spec names (ZeRO and FSDP shard it, but must not change its result). It
ignores the spec's knobs, which is the point (they are what a fault breaks), except the
workload's own choices: which ranks' losses include the aux head, dropout (drawn as
``dropout.py`` keys it, so the masks are the ones a correct run draws), the learning-rate
schedule, and each rank's input jitter (drawn from a generator seeded as that rank seeds
its RNG). A restart changes nothing here: a correct resume trains on as if it had not
stopped.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from distdoctor.analysis.distance import max_abs_diff, param_history
from distdoctor.models import Fingerprint, Knobs, ReferenceComparison, RunRecord, RunSpec
from distdoctor.training.dropout import reference_masks
from distdoctor.training.fingerprint import fingerprint
from distdoctor.training.workload import (
    batch_ids,
    build_model,
    jitter_seed,
    jittered,
    loss_fn,
    make_dataset,
    make_optimizer,
    make_scheduler,
)


def reference_params(spec: RunSpec) -> tuple[Fingerprint, ...]:
    """Parameter fingerprints after construction (index 0) and after every step."""
    knobs = spec.knobs
    clean = dataclasses.replace(spec, knobs=Knobs(
        aux_skipped_on=knobs.aux_skipped_on, dropout=knobs.dropout, lr_decay=knobs.lr_decay,
        input_jitter=knobs.input_jitter))
    model = build_model(clean, rank=0)
    params = list(model.parameters())
    optimizer = make_optimizer(params, clean)
    scheduler = make_scheduler(optimizer, clean) if knobs.lr_decay != 1.0 else None
    replicas = range(0, clean.world_size, clean.tp_degree)  # one rank per replica
    jitter = {rank: torch.Generator().manual_seed(jitter_seed(clean, rank)) for rank in replicas}
    x, y = make_dataset(clean)
    prints = [fingerprint(params, clean.fingerprint_values)]
    for step in range(1, clean.num_steps + 1):
        optimizer.zero_grad(set_to_none=True)
        losses = []
        for rank in replicas:
            ids = batch_ids(clean, rank, step)
            masks = reference_masks(clean, step, ids) if clean.knobs.dropout else None
            inputs = jittered(clean, x[ids], jitter[rank])
            out, aux = model(inputs, use_aux=clean.uses_aux(rank), masks=masks)
            losses.append(loss_fn(out, aux, y[ids]))
        (sum(losses, torch.zeros(())) / len(losses)).backward()  # 0.0 + l0 + ...: as before
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        prints.append(fingerprint(params, clean.fingerprint_values))
    return tuple(prints)


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
