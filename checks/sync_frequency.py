"""How much gradient traffic does one optimiser step move, against the minimum?

One synchronisation of all gradients per step is the minimum (however many buckets or
layers it is split into, all-reduced or reduce-scattered); more bytes than that means
gradients were synchronised more than once, typically after every accumulation micro-batch.
"""

from __future__ import annotations

from checks import finding
from harness.models import Finding, RunRecord

NAME = "sync_frequency"


def check(record: RunRecord) -> list[Finding]:
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
        "allreduce-every-microbatch", NAME, f"{calls} grad collectives/step, {wasted:.0%} wasted",
        f"{calls} gradient collectives (all-reduce, or reduce-scatter where gradients are "
        f"sharded) per optimiser step moving {sent} bytes, where one sync of "
        f"{minimum} bytes would do: {wasted:.0%} of the gradient traffic is wasted",
        {"knobs.no_sync_accumulation": True}, ranks,
        {"allreduces_per_step": calls, "bytes_per_step": sent,
         "minimum_bytes_per_step": minimum, "wasted_share": wasted,
         "steps_affected": len({s.step for _, s in excess})})]
