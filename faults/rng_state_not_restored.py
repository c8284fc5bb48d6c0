"""A resumed rank draws random numbers another rank would have drawn."""

from distdoctor.faults import Fault, Variant, restarted
from distdoctor.models.strategies import DATA_PARALLEL

FAULT = Fault(
    id="rng-state-not-restored",
    title="After a restart the ranks' random streams are not their own",
    strategies=DATA_PARALLEL,
    symptom="after resuming from a checkpoint, ranks draw dropout masks and augmentations "
            "from another rank's RNG state, so the run is not the one that never stopped",
    cause="the checkpoint holds one RNG state for all ranks (saved by rank 0 only, or under "
          "one key that torch.distributed.checkpoint deduplicates), and every rank loads it",
    fix="save and load torch.get_rng_state() per rank: under a key of its own "
        "(f'rng/{rank}') or in a file of its own",
    variants=(Variant("one-rank-kept", "the RNG state is saved under one key for every rank, "
                      "so the checkpoint keeps one rank's", {"knobs.restored_rng": "one-rank"}),),
    scenario=restarted,
    reported_as=("rng-state-not-restored",),
)
