"""Did a NaN or Inf appear, and on which rank first?

A non-finite value spreads: one rank's NaN gradient, all-reduced, is every rank's NaN
gradient and then every rank's NaN parameters. So what matters is where it was first:
the earliest optimiser step at which any rank's loss or own gradient (before
synchronisation) was non-finite, and the ranks it was on then. The ranks it reached
later (a step later, through the all-reduce) are named with the step they first showed
it. Steps an optimiser skipped (as GradScaler skips steps whose gradients overflowed, on
purpose) are never seen.
"""

from __future__ import annotations

import math

from distdoctor.models import Finding, Fingerprint, RunRecord
from distdoctor.models.calls import first_few, ranks_phrase

NAME = "non_finite"
SHOWN_NAMES = 4  # tensors named where a value went non-finite; the rest counted
FIX = ("find what made the value non-finite on the rank where it started, at the step "
       "named: a bad sample (check the batch for NaN/Inf), a log or division by zero in the "
       "loss, a learning rate that made the parameters blow up; guard the step with "
       "torch.isfinite(loss) (skip it on every rank alike), or clip gradients "
       "(torch.nn.utils.clip_grad_norm_)")


def check(record: RunRecord) -> list[Finding]:
    if any(r.evidence.steps for r in record.ranks):
        return _built_in(record)
    seen = [(r.rank, e) for r in record.ranks for e in r.evidence.nonfinite]
    if not seen:
        return []
    firsts: dict[int, int] = {}
    for rank, e in seen:
        firsts[rank] = min(firsts.get(rank, e.step), e.step)
    first = min(firsts.values())
    at_first = sorted((rank, e) for rank, e in seen if e.step == first)
    origin = sorted({rank for rank, _ in at_first})
    by_loss = sorted({rank for rank, e in at_first if not e.loss_finite})
    by_grad = sorted({rank for rank, e in at_first if e.local})
    reached = {rank: step for rank, step in sorted(firsts.items()) if step > first}
    params = sorted({name for _, e in at_first for name in e.local})
    loss_where = next((e.loss_where for rank, e in at_first if rank in by_loss), "")
    where = loss_where or at_first[0][1].where
    what = []
    if by_loss:
        losses = ", ".join(f"{e.loss}" for rank, e in at_first if rank in by_loss)
        what.append(f"the loss was {losses} on {ranks_phrase(by_loss)} (backward at "
                    f"{loss_where})")
    if by_grad:
        what.append(f"the gradients of {_shown(params)} were non-finite on "
                    f"{ranks_phrase(by_grad)} before any synchronisation")
    if reached:
        what.append("it reached " + ", ".join(f"rank {rank} at step {step}"
                                             for rank, step in reached.items())
                    + " through the synchronisation")
    measured = {"first_step": first, "origin_ranks": origin, "loss_ranks": by_loss,
                "gradient_ranks": by_grad, "reached": {str(r): s for r, s in reached.items()},
                "params": params,
                "losses": {str(rank): e.loss for rank, e in at_first if e.loss is not None},
                "where": where, "step_where": at_first[0][1].where}
    return [Finding(
        check=NAME, fault="non-finite",
        symptom=f"a NaN or Inf first appeared at optimiser step {first} on "
                f"{ranks_phrase(origin)}: " + "; ".join(what),
        cause=f"{ranks_phrase(origin)} produced a non-finite value at step {first}, and "
              f"synchronisation spreads it to every rank",
        fix=FIX, fix_changes={}, ranks=tuple(origin), measured=measured,
        headline=f"NaN/Inf from step {first} on {ranks_phrase(origin)}",
        kind="non-finite", first_step=first, where=(where,) if where else ())]


def _shown(names: list[str]) -> str:
    return first_few(names, SHOWN_NAMES)


def _finite(gradient: Fingerprint | None) -> bool:
    """A recorded gradient's norm is finite (a gradient not recorded counts as finite)."""
    return gradient is None or math.isfinite(gradient.norm)


def _built_in(record: RunRecord) -> list[Finding]:
    """The built-in workload records every step's loss and gradient norms itself."""
    bad = [(r.rank, s) for r in record.ranks for s in r.evidence.steps
           if not (math.isfinite(s.loss) and _finite(s.grad_local) and _finite(s.grad_synced))]
    if not bad:
        return []
    first = min(s.step for _, s in bad)
    at_first = [(rank, s) for rank, s in bad if s.step == first]
    origin = sorted(rank for rank, s in at_first
                    if not (math.isfinite(s.loss) and _finite(s.grad_local)))
    received = sorted(rank for rank, _ in at_first if rank not in origin)
    culprits = origin or received
    return [Finding(
        check=NAME, fault="non-finite",
        symptom=f"a NaN or Inf first appeared at step {first} on {ranks_phrase(culprits)}"
                + (f"; {ranks_phrase(received)} only received it through the all-reduce"
                   if origin and received else ""),
        cause=f"{ranks_phrase(culprits)} produced a non-finite value at step {first}",
        fix=FIX, fix_changes={}, ranks=tuple(culprits),
        measured={"first_step": first, "origin_ranks": origin, "received_ranks": received,
                  "losses": {str(rank): s.loss for rank, s in at_first}},
        headline=f"NaN/Inf from step {first} on {ranks_phrase(culprits)}",
        kind="non-finite", first_step=first)]
