"""A resumed rank steps with a fresh optimiser while the others keep their moments."""

from distdoctor.faults import Fault, Variant, restarted
from distdoctor.models.strategies import DATA_PARALLEL

FAULT = Fault(
    id="optimizer-state-not-restored",
    title="After a restart some ranks step with fresh optimiser state",
    strategies=DATA_PARALLEL,
    symptom="after resuming from a checkpoint, some ranks' optimiser state (Adam's moments, "
            "its step count, the learning rate) is not what they saved, so their updates "
            "differ from the run that never stopped",
    cause="the optimiser's state is loaded on one rank only (optimizer.load_state_dict "
          "under `if rank == 0`)",
    fix="load the optimiser's state on every rank (each its own shard where it is sharded)",
    variants=(Variant("rank-0-only", "only rank 0 loads the optimiser's state",
                      {"knobs.restored_optimizer": "rank-0"}),),
    scenario=restarted,
    reported_as=("optimizer-state-not-restored",),
)
