"""Did a NaN or Inf appear, and on which rank first?

A non-finite value spreads: one rank's NaN gradient, all-reduced, is every rank's NaN
gradient and then every rank's NaN parameters. So what matters is where it was first:
the earliest optimiser step at which any rank saw one, and at that step the ranks whose
own loss or own gradient (before synchronisation) was non-finite. Ranks that only
received it through the all-reduce are named as such. Steps an optimiser skipped (as
GradScaler skips steps whose gradients overflowed, on purpose) are never seen.
"""

from __future__ import annotations

import math

from checks import rank_list
from harness.models import Finding, RunRecord

NAME = "non_finite"
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
    first = min(e.step for _, e in seen)
    at_first = [(rank, e) for rank, e in seen if e.step == first]
    by_loss = sorted(rank for rank, e in at_first if not e.loss_finite)
    by_grad = sorted(rank for rank, e in at_first if e.local)
    origin = sorted(set(by_loss) | set(by_grad))
    received = sorted(rank for rank, e in at_first if e.applied and rank not in origin)
    params = sorted({name for _, e in at_first for name in (e.local or e.applied)})
    loss_where = next((e.loss_where for rank, e in at_first if rank in by_loss), "")
    where = loss_where or at_first[0][1].where
    what = []
    if by_loss:
        losses = ", ".join(f"{e.loss}" for rank, e in at_first if rank in by_loss)
        what.append(f"the loss was {losses} on {rank_list(by_loss)} (backward at "
                    f"{loss_where})")
    if by_grad:
        what.append(f"the gradients of {_names(at_first, 'local')} were non-finite on "
                    f"{rank_list(by_grad)} before any synchronisation")
    if not origin:
        what.append(f"no rank's own loss or gradient was, but the gradients about to be "
                    f"applied on {rank_list(received)} were ({_names(at_first, 'applied')}): "
                    f"the synchronisation or a gradient hook made them so")
    if received:
        what.append(f"{rank_list(received)} only received it through the all-reduce")
    culprits = origin or received
    measured = {"first_step": first, "origin_ranks": origin, "loss_ranks": by_loss,
                "gradient_ranks": by_grad, "received_ranks": received, "params": params,
                "losses": {str(rank): e.loss for rank, e in at_first if e.loss is not None},
                "where": where, "step_where": at_first[0][1].where}
    return [Finding(
        check=NAME, fault="non-finite",
        symptom=f"a NaN or Inf first appeared at optimiser step {first} on "
                f"{rank_list(culprits)}: " + "; ".join(what),
        cause=f"{rank_list(culprits)} produced a non-finite value at step {first}, and "
              f"synchronisation spreads it to every rank",
        fix=FIX, fix_changes={}, ranks=tuple(culprits), measured=measured,
        headline=f"NaN/Inf from step {first} on {rank_list(culprits)}")]


def _names(at_first: list, field: str) -> str:
    names = sorted({name for _, e in at_first for name in getattr(e, field)})
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return shown


def _built_in(record: RunRecord) -> list[Finding]:
    """The built-in workload records every step's loss and gradient norms itself."""
    bad = [(r.rank, s) for r in record.ranks for s in r.evidence.steps
           if not (math.isfinite(s.loss) and math.isfinite(s.grad_local.norm)
                   and math.isfinite(s.grad_synced.norm))]
    if not bad:
        return []
    first = min(s.step for _, s in bad)
    at_first = [(rank, s) for rank, s in bad if s.step == first]
    origin = sorted(rank for rank, s in at_first
                    if not (math.isfinite(s.loss) and math.isfinite(s.grad_local.norm)))
    received = sorted(rank for rank, _ in at_first if rank not in origin)
    culprits = origin or received
    return [Finding(
        check=NAME, fault="non-finite",
        symptom=f"a NaN or Inf first appeared at step {first} on {rank_list(culprits)}"
                + (f"; {rank_list(received)} only received it through the all-reduce"
                   if origin and received else ""),
        cause=f"{rank_list(culprits)} produced a non-finite value at step {first}",
        fix=FIX, fix_changes={}, ranks=tuple(culprits),
        measured={"first_step": first, "origin_ranks": origin, "received_ranks": received,
                  "losses": {str(rank): s.loss for rank, s in at_first}},
        headline=f"NaN/Inf from step {first} on {rank_list(culprits)}")]
