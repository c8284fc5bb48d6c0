"""A resumed run starts its learning-rate schedule over."""

from distdoctor.faults import Fault, Variant, restarted
from distdoctor.models.strategies import DATA_PARALLEL

FAULT = Fault(
    id="scheduler-not-restored",
    title="After a restart the learning rate jumps back",
    strategies=DATA_PARALLEL,
    symptom="after resuming from a checkpoint, the learning rate restarts its schedule "
            "(a warm-up or decay begins again), so the loss curve is not the one the job "
            "would have had",
    cause="the checkpoint saves the model and the optimiser but not the LR scheduler's "
          "state, so a fresh scheduler counts its steps from 0",
    fix="save scheduler.state_dict() with the checkpoint and call "
        "scheduler.load_state_dict(...) on resume",
    variants=(Variant("not-saved", "the scheduler's state is left out of the checkpoint",
                      {"knobs.restore_scheduler": False}),),
    scenario=restarted,
    reported_as=("scheduler-not-restored",),
)
