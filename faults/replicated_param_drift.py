"""Parameters replicated across a tensor-parallel group get no gradient sync, and drift."""

import dataclasses

from distdoctor.faults import Fault, Variant


def _sequence_parallel(spec):
    """The replicated layers must see part of the batch for their gradients to differ:
    sequence parallelism, where each rank keeps its rows after the row-parallel layer."""
    return dataclasses.replace(spec, knobs=dataclasses.replace(spec.knobs,
                                                               sequence_parallel=True))


FAULT = Fault(
    id="replicated-param-drift",
    title="Replicated weights drift apart under tensor parallelism",
    strategies=("tp", "tp-dp"),
    symptom="parameters every rank of a tensor-parallel group should hold identically "
            "(fc2's bias, the heads) differ after the first step and drift further apart "
            "each step, while the activations feeding them agree",
    cause="under sequence parallelism each rank's copy of a replicated layer sees only its "
          "own rows, so its gradient is that share; nothing sums the shares over the "
          "tensor-parallel group before the optimiser steps",
    fix="all-reduce the gradients of the parameters in the sequence-parallel region over "
        "the tensor-parallel group before the step (Megatron does this for its norms; with "
        "parallelize_module, SequenceParallel(sequence_dim=the split dimension) on those "
        "modules, which makes their gradients summed)",
    variants=(Variant("unsynced", "the replicated layers' gradients are each rank's share",
                      {"knobs.tp_sync_replicated_grads": False}),),
    scenario=_sequence_parallel,
    reported_as=("replicated-param-drift",),
)
