"""Do the ranks hold the same parameters? Spread at construction and after every step.

Data parallelism keeps one model in N copies: any spread at all means the copies differ.
Spread from construction on means the ranks never started alike (divergent init); spread
that starts later means they applied different updates (reported, with no fix of its
own: another finding says why).
"""

from __future__ import annotations

from checks import finding, rank_list
from harness.models import Finding, RunRecord
from harness.models.distance import param_history, spreads

TOLERANCE = 1e-6
NAME = "param_spread"


def check(record: RunRecord) -> list[Finding]:
    if len(record.ranks) < 2:
        return []
    per_step = spreads(record)
    first = next((i for i, value in enumerate(per_step) if value > TOLERANCE), None)
    if first is None:
        return []
    histories = [param_history(record, r.rank) for r in record.ranks]
    differ = [r.rank for r, h in zip(record.ranks, histories)
              if h[first].digest != histories[0][first].digest]
    measured = {"spread_per_step": list(per_step), "first_divergent_step": first,
                "ranks_differing_from_rank_0": differ, "tolerance": TOLERANCE}
    trail = ", ".join(f"{value:.3g}" for value in per_step)
    if first == 0:
        return [finding(
            "divergent-init", NAME, f"spread {per_step[0]:.3g} at step 0",
            f"parameters differ across ranks right after construction: spread "
            f"{per_step[0]:.3g} at step 0 (limit {TOLERANCE:g}); {rank_list(differ)} differ "
            f"from rank 0; spread per step: {trail}",
            {"knobs.broadcast_params_at_start": True}, differ, measured)]
    return [Finding(
        check=NAME, fault="divergent-updates",
        symptom=f"the ranks started identical but diverge from step {first}: spread "
                f"{per_step[first]:.3g} (limit {TOLERANCE:g}); {rank_list(differ)} differ "
                f"from rank 0; spread per step: {trail}",
        cause=f"the ranks applied different updates at step {first}: their gradients were "
              f"not synchronised to the same values",
        fix="see the other findings for why the gradient synchronisation failed",
        fix_changes={}, ranks=tuple(differ), measured=measured,
        headline=f"spread {per_step[first]:.3g} from step {first}")]
