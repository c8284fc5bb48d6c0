"""How much gradient traffic does one optimiser step move, against the minimum?

One synchronisation of all gradients per step is the minimum (however many buckets or
layers it is split into, all-reduced or reduce-scattered); more bytes than that means
gradients were synchronised more than once, typically after every accumulation micro-batch.
"""

from __future__ import annotations

from distdoctor.analysis.forwards import completed_steps, forwards_without_backward
from distdoctor.checks import finding
from distdoctor.models import DDPForward, Finding, RunRecord, SkippedStep

NAME = "allreduce_every_microbatch"


def check(record: RunRecord) -> list[Finding]:
    if not any(r.evidence.steps for r in record.ranks):
        return _user_ddp(record)
    excess = [(r.rank, s) for r in record.ranks for s in r.evidence.steps
              if s.allreduce_bytes > s.gradient_bytes]
    if not excess:
        return []
    calls = max(s.allreduce_calls for _, s in excess)
    sent = max(s.allreduce_bytes for _, s in excess)
    minimum = excess[0][1].gradient_bytes
    wasted = (sent - minimum) / sent
    ranks = sorted({rank for rank, _ in excess})
    return [finding(
        "allreduce-every-microbatch", check=NAME,
        headline=f"{calls} grad collectives/step, {wasted:.0%} wasted",
        symptom=f"{calls} gradient collectives (all-reduce, or reduce-scatter where gradients are "
        f"sharded) per optimiser step moving {sent} bytes, where one sync of "
        f"{minimum} bytes would do: {wasted:.0%} of the gradient traffic is wasted",
        fix_changes={"knobs.no_sync_accumulation": True}, ranks=ranks,
        measured={"allreduces_per_step": calls, "bytes_per_step": sent,
         "minimum_bytes_per_step": minimum, "wasted_share": wasted,
         "steps_affected": len({s.step for _, s in excess})},
        kind="allreduce-every-microbatch")]


def _skipped_after(forward: DDPForward, skipped: tuple[SkippedStep, ...]) -> bool:
    """Was the step this forward's gradients were for skipped (by a GradScaler)?"""
    return forward.t is not None and any(
        s.steps_before == forward.steps_before and s.t > forward.t for s in skipped)


def _user_ddp(record: RunRecord) -> list[Finding]:
    """A user's script: the DDP forwards at one line between two optimiser steps are one
    step's micro-batches, and only the last needs its backward to sync (the others belong
    in ``no_sync()``). Steps of a single forward there are not judged: nothing to
    accumulate. A forward at another line (a validation pass through the wrapper on one
    rank, whose backward never runs) is no micro-batch of the step, nor is one of a step
    a GradScaler skipped (its gradients overflowed: never applied). Accumulation is how a
    loop is written, so it shows in most of its steps: a line whose steps sync more than
    once in half of them or fewer had a step retried (a loss passed over, then the next
    batch), not micro-batches."""
    excess, where = [], ""
    for rank in record.ranks:
        per_step: dict[tuple[int, str], list] = {}
        skipped = forwards_without_backward(rank.evidence) or []
        stepped = completed_steps(rank.evidence)  # accumulation ends in an optimiser step
        for forward in rank.evidence.ddp_forwards:
            if forward in skipped or forward.steps_before not in stepped:
                continue  # a skipped step's forward (partial_step), or no step followed
            if _skipped_after(forward, rank.evidence.skipped):
                continue  # its gradients were never applied: the scaler skipped the step
            per_step.setdefault((forward.steps_before, forward.where), []).append(forward)
        by_line: dict[str, list[tuple]] = {}  # line -> (rank, step, forwards, syncs, bytes)
        for (step, line), forwards in per_step.items():  # (in the order the steps ran)
            by_line.setdefault(line, []).append((rank.rank, step, len(forwards), sum(
                f.sync for f in forwards), forwards[0].gradient_bytes))
        for line, steps in by_line.items():
            over = [s for s in steps if s[2] > 1 and s[3] > 1]
            if 2 * len(over) > len(steps):  # the loop's habit, not one step retried
                excess += over
                where = where or line
    if not excess:
        return []
    micro = max(e[2] for e in excess)
    syncs = max(e[3] for e in excess)
    minimum = excess[0][4]
    sent = syncs * minimum
    wasted = (sent - minimum) / sent
    ranks = sorted({e[0] for e in excess})
    return [finding(
        "allreduce-every-microbatch", check=NAME,
        headline=f"{syncs} grad syncs/step, {wasted:.0%} wasted",
        symptom=f"{syncs} of {micro} DDP forwards per optimiser step synchronise gradients (at "
        f"{where}), moving {sent} bytes where one sync of {minimum} bytes would do: "
        f"{wasted:.0%} of the gradient traffic is wasted",
        fix_changes={"knobs.no_sync_accumulation": True}, ranks=ranks,
        measured={"syncs_per_step": syncs, "micro_batches_per_step": micro, "bytes_per_step": sent,
         "minimum_bytes_per_step": minimum, "wasted_share": wasted,
         "steps_affected": len({e[1] for e in excess}), "where": where},
        fix=f"run every micro-batch but the last inside `with model.no_sync():` (the "
            f"forward at {where} and its backward), so only the last backward all-reduces",
        kind="allreduce-every-microbatch", where=where)]
