"""Which of a rank's DDP training forwards were followed by their backward: the first half
of a step a rank may run without the second.

A training forward through DistributedDataParallel (grad enabled, module in training
mode) prepares DDP's reducer for a backward whose all-reduces every rank of its group
makes. A forward whose backward never comes, while the group's other ranks run theirs,
shifts every later all-reduce of DDP's by one on that rank: gloo pairs one rank's
backward of step k with another's of step k + 1, silently, until a rank runs out. Read
from the DDP forwards the tracer writes and the backward spans the phase recorder does
(both with times on the machine-wide monotonic clock)."""

from __future__ import annotations

from distdoctor.models.evidence import DDPForward, Evidence


def forwards_without_backward(evidence: Evidence) -> list[DDPForward] | None:
    """The training forwards followed by another forward before any backward, at a line
    whose other forwards had theirs (the training loop's: a forward at a line of its own,
    a validation pass through the wrapper, is no skipped step); None when the rank
    recorded no backward spans (traced light, or before phases were kept), so nothing can
    be said. A rank's last forward is not judged: what follows it is not recorded."""
    backwards = sorted(p.start for p in evidence.phases if p.kind == "backward")
    timed = sorted((f for f in evidence.ddp_forwards if f.t is not None),
                   key=lambda f: f.t or 0.0)
    if not backwards or not timed:
        return None
    alone, followed = [], set()
    for forward, following in zip(timed, timed[1:]):
        assert forward.t is not None and following.t is not None
        if any(forward.t < start < following.t for start in backwards):
            followed.add(forward.where)
        else:
            alone.append(forward)
    if timed[-1].t is not None and any(start > timed[-1].t for start in backwards):
        followed.add(timed[-1].where)
    return [f for f in alone if f.where in followed]


def completed_steps(evidence: Evidence) -> set[int]:
    """The optimiser steps the rank completed, each as the steps before it (the count its
    forwards carry): a forward's count is a step once a later forward, an optimiser phase
    or sampled gradients show the step was taken (a loop that never steps, or a step cut
    short by an error, accumulates nothing)."""
    return {f.steps_before - 1 for f in evidence.ddp_forwards} | \
        {p.step for p in evidence.phases if p.kind == "optimizer"} | \
        {g.step - 1 for g in evidence.gradients}
