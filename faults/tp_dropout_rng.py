"""Dropout under tensor parallelism draws from the wrong RNG state."""

import dataclasses

from distdoctor.faults import Fault, Variant


def _with_dropout(spec):
    return dataclasses.replace(spec, knobs=dataclasses.replace(spec.knobs, dropout=0.2))


FAULT = Fault(
    id="tp-dropout-rng",
    title="Dropout masks disagree across tensor-parallel ranks",
    strategies=("tp", "tp-dp"),
    symptom="dropout masks that a tensor-parallel group must share differ from rank to "
            "rank, or the masks of different slices of one activation are the same",
    cause="every rank draws dropout from its own RNG state, the replicated activations' "
          "masks too, so the copies of one activation are dropped differently",
    fix="keep two RNG states as Megatron's tracker does: one the tensor-parallel group "
        "shares, for dropout on replicated activations, and one per rank (seed + rank), "
        "for dropout on sharded ones",
    variants=(
        Variant("per-rank", "every rank draws every mask from its own RNG state",
                {"knobs.tp_dropout_rng": "per-rank"}),
        Variant("same-for-slices", "one RNG state everywhere: every slice of fc1's output "
                "gets the same mask", {"knobs.tp_dropout_rng": "same-for-slices"}),
    ),
    scenario=_with_dropout,
    reported_as=("tp-dropout-rng",),
)
