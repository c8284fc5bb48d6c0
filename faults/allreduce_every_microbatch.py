"""Gradient accumulation all-reduces after every micro-batch instead of once per step."""

import dataclasses

from distdoctor.faults import Fault, Variant
from distdoctor.models import RunSpec
from distdoctor.models.strategies import DATA_PARALLEL


def _accumulate(spec: RunSpec) -> RunSpec:
    """The fault needs gradient accumulation: four micro-batches where the batch allows."""
    if spec.micro_batches > 1:
        return spec
    k = next((d for d in (4, 2) if spec.batch_size % d == 0), 1)
    return dataclasses.replace(spec, micro_batches=k)


FAULT = Fault(
    id="allreduce-every-microbatch",
    title="Accumulation is slow",
    strategies=DATA_PARALLEL,
    symptom="with k micro-batches per step the gradients are all-reduced k times, so "
            "(k-1)/k of the gradient traffic is wasted (the result is the same)",
    cause="every micro-batch's backward synchronises gradients; only the last one needs to",
    fix="run all but the last micro-batch inside model.no_sync()",
    variants=(Variant("no-no-sync", "accumulate without no_sync()",
                      {"knobs.no_sync_accumulation": False}),),
    scenario=_accumulate,
    reported_as=("allreduce-every-microbatch",),
)
