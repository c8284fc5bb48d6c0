"""Was the gradient each optimiser step applied synchronised? DDP syncs in the backward of
a forward run outside ``no_sync()``; accumulation must leave exactly the last micro-batch
outside it, so that its backward all-reduces the sum of all of them. When the last forward
before a step ran inside ``no_sync()`` (the sync put on the first micro-batch, or never),
the micro-batches after the sync stay each rank's own: the replicas apply different
gradients and part from that step, silently.

Read from DDP's forwards (the tracer notes each one's ``require_backward_grad_sync``, and
how many optimiser steps came before it): a step's micro-batches are its forwards at one
line, as allreduce_every_microbatch reads them. Only steps an optimiser step ended are judged,
and not those whose gradients the script reduced itself after the last micro-batch (every
micro-batch inside ``no_sync()``, then an all-reduce of the gradients by hand, moving as
many bytes as DDP's sync would): their replicas do apply one gradient.
"""

from __future__ import annotations

from distdoctor.checks import float_reductions, reduced_bytes
from distdoctor.models import DDPForward, Evidence, Finding, RunRecord
from distdoctor.models.calls import ranks_phrase, relative_line

NAME = "unsynced_microbatches"


def _reduced_by_hand(evidence: Evidence, before: int, last: DDPForward) -> bool:
    """Did the rank reduce as many floating-point gradient bytes as one DDP sync moves,
    over a group holding its DDP group, after the step's last forward and before the
    step (its reductions' step count is the optimiser steps before them)?"""
    if last.t is None:
        return False
    moved = sum(reduced_bytes(c) for c in float_reductions(evidence, set(evidence.ddp_group))
                if c.step == before and c.entered > last.t)
    return moved >= last.gradient_bytes


def check(record: RunRecord) -> list[Finding]:
    unsynced: dict[int, list[tuple[int, int, int, str]]] = {}  # rank -> (step, n, synced, where)
    for rank in record.ranks:
        taken = max((g.step for g in rank.evidence.gradients), default=0)
        per_step: dict[tuple[int, str], list] = {}
        for forward in rank.evidence.ddp_forwards:
            per_step.setdefault((forward.steps_before, forward.where), []).append(forward)
        for (before, where), forwards in sorted(per_step.items()):
            if before + 1 > taken or forwards[-1].sync:
                continue  # no optimiser step followed, or the last micro-batch synced
            if _reduced_by_hand(rank.evidence, before, forwards[-1]):
                continue  # the script synchronised the sum itself
            synced = next((i + 1 for i, f in enumerate(forwards) if f.sync), 0)
            unsynced.setdefault(rank.rank, []).append((before + 1, len(forwards), synced,
                                                       where))
    if not unsynced:
        return []
    first = min(s[0] for found in unsynced.values() for s in found)
    step, micro, synced, where = min(
        (s for found in unsynced.values() for s in found), key=lambda s: s[0])
    line = relative_line(where)
    how = (f"synced at micro-batch {synced} of {micro}" if synced else
           f"none of its {micro} micro-batches synced")
    return [Finding(
        check=NAME, fault="unsynced-microbatches", kind="unsynced-microbatches",
        headline=f"step {step}: {how}",
        symptom=f"optimiser step {step} applied a gradient whose last micro-batch ran "
                f"inside no_sync() ({how}, forward at {line}) on "
                f"{ranks_phrase(unsynced)}: the micro-batches after the sync stay each "
                f"rank's own, so the replicas apply different gradients "
                f"({sum(len(v) for v in unsynced.values())} such steps in all)",
        cause="gradient accumulation whose no_sync() covers the last micro-batch instead "
              "of all the others (an off-by-one in the condition that chooses it)",
        fix=f"run every micro-batch but the last inside `with model.no_sync():` at {line} "
            f"(for example `micro < accumulation - 1`), so the last backward all-reduces "
            f"the whole sum",
        fix_changes={}, ranks=tuple(sorted(unsynced)), first_step=first, where=(line,),
        measured={"first_step": first, "micro_batches": micro, "synced_at": synced,
                  "steps": {str(r): [s[0] for s in v] for r, v in unsynced.items()}})]
