"""Every rank draws the same samples, or every epoch replays the first one's order."""

import dataclasses

from distdoctor.faults import Fault, Variant
from distdoctor.models import RunSpec
from distdoctor.models.strategies import DATA_PARALLEL


def _two_epochs(spec: RunSpec) -> RunSpec:
    """Repeated epochs only show from the second epoch on."""
    return dataclasses.replace(spec, num_steps=max(spec.num_steps, 2 * spec.steps_per_epoch))


FAULT = Fault(
    id="shared-shuffle-seed",
    title="All ranks see the same batches",
    strategies=DATA_PARALLEL,
    symptom="the ranks train on the same samples, so N ranks do the work of one "
            "(or every epoch replays the first epoch's order)",
    cause="every rank shuffles with one shared seed and takes the same slice, instead of "
          "a shared shuffle dealt out by rank (or the epoch is never passed to the sampler)",
    fix="shard with a distributed sampler (shared seed + epoch, indices[rank::world_size]) "
        "and call sampler.set_epoch(epoch) every epoch",
    variants=(
        Variant("same-seed", "every rank shuffles with the same seed and takes the same slice",
                {"knobs.sampler": "shared-seed"}),
        Variant("epoch-not-set", "the sampler is never told the epoch, so every epoch "
                "repeats epoch 0's order", {"knobs.sampler_set_epoch": False}),
    ),
    scenario=_two_epochs,
    reported_as=("duplicate-samples", "repeated-epoch-order"),
)
