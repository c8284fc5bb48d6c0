"""Every pipeline stage sends before it receives, so neighbours block in send together."""

import dataclasses

from distdoctor.faults import Fault, Variant
from distdoctor.models import RunSpec


def _steady_and_short(spec: RunSpec) -> RunSpec:
    """1F1B only exchanges in its steady state (two or more micro-batches), and a
    deliberate hang needs no more than 3 s to count as one. The stack is of identical
    blocks, so that any equal cut is even and the fix's verification judges the order of
    sends, not the cut: the default stack (12 MLP and 4 attention blocks) has no even cut
    on 4 stages, and its best two tie, one of them measured at 1.4x the mean stage time."""
    micro = spec.micro_batches if spec.micro_batches >= 2 else 8
    batch = spec.batch_size if spec.batch_size % micro == 0 else 2 * micro
    return dataclasses.replace(spec, micro_batches=micro, batch_size=batch,
                               pipe=dataclasses.replace(spec.pipe, layers="m" * 16),
                               deadline=min(spec.deadline, 3.0))


FAULT = Fault(
    id="send-before-receive",
    title="Pipeline hangs on the wire",
    strategies=("pipe-1f1b",),
    symptom="the pipeline stops in its steady state: neighbouring stages both sit in a "
            "blocking send, each waiting for the other to receive (on gloo, for any tensor "
            "size, until the 30-minute group timeout)",
    cause="every stage sends before it receives, so when neighbours exchange activations "
          "and gradients at the same time nobody receives",
    fix="even ranks send first, odd ranks receive first (or post isend and irecv together "
        "and wait on both)",
    variants=(Variant("send-first", "every stage sends, then receives",
                      {"knobs.p2p_order": "send-first"}),),
    scenario=_steady_and_short,
    reported_as=("p2p-cycle",),
)
