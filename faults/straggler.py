"""One rank's every step takes longer, and every other rank waits for it."""

import dataclasses

from distdoctor.faults import Fault, Variant
from distdoctor.models import RunSpec


def _enough_steps(spec: RunSpec) -> RunSpec:
    """Enough steps to judge who arrives last with a margin (the check wants a dozen at
    least; the first, start-up, is never judged)."""
    return dataclasses.replace(spec, num_steps=max(spec.num_steps, 16))


FAULT = Fault(
    id="straggler",
    title="Training runs at the pace of one slow rank",
    strategies=("ddp", "torch-ddp"),
    symptom="one rank arrives last at the gradient all-reduce step after step, and every "
            "other rank spends part of each step waiting for it",
    cause="that rank does more per step than the others: its batches arrive late (a "
          "starved data loader, slow storage) or it runs work the others do not (logging, "
          "evaluation, a checkpoint on one rank), and a collective waits for its last member",
    fix="give that rank the same work per step: feed it faster (more loader workers, "
        "prefetching, faster storage) or move its extra work off the step (every N steps, "
        "in the background, or shared by every rank)",
    variants=(Variant("slow-loader", "rank 1's batches arrive 20 ms late",
                      {"knobs.straggler_rank": 1, "knobs.straggler_in": "loader"}),
              Variant("extra-work", "rank 1 computes 20 ms more after each optimiser step",
                      {"knobs.straggler_rank": 1, "knobs.straggler_in": "work"})),
    scenario=_enough_steps,
    excluded=dict.fromkeys(("zero1", "zero2", "zero3", "torch-zero", "fsdp2", "fsdp2-grad-op"),
                           "every data-parallel strategy waits at its collectives for the "
                           "last member alike; hand-rolled DDP (arrivals traced) and torch's "
                           "DDP (arrivals from the Flight Recorder) show both sources"),
    reported_as=("straggler",),
)
