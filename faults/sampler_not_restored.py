"""A resumed run reads again the batches it already trained on."""

from distdoctor.faults import Fault, Variant, restarted
from distdoctor.models.strategies import DATA_PARALLEL

FAULT = Fault(
    id="sampler-not-restored",
    title="After a restart the loader starts its epoch over",
    strategies=DATA_PARALLEL,
    symptom="after resuming from a checkpoint, the ranks read batches they already trained "
            "on this epoch (or replay another epoch's order), so some samples are read "
            "twice and others never",
    cause="the checkpoint does not keep the loader's place: the sampler's epoch "
          "(set_epoch) and the batches already read in it",
    fix="save the epoch and the number of batches read with the checkpoint; on resume call "
        "sampler.set_epoch(epoch) and skip the batches already read",
    variants=(
        Variant("position-lost", "the epoch is restored but the loader starts it over",
                {"knobs.restored_sampler": "epoch-only"}),
        Variant("epoch-lost", "neither the epoch nor the place in it is restored",
                {"knobs.restored_sampler": "nothing"}),
    ),
    scenario=restarted,
    reported_as=("sampler-not-restored",),
)
