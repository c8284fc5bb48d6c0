"""The edits that cure a finding in a user's own script, by the cause they cure.

Each remedy takes the script's source, the finding's line (the line the report names) and
its other lines in the same file (``also``: where a step is, say), and returns the edited
source, or None where no edit is safe (the code is not the shape the remedy knows: then
the report's prose fix stands alone). Edits go through libcst, which keeps every byte it
is not told to change (formatting, comments), so the patch is the lines that change and
nothing else. A remedy proposes; it never decides that it worked: patches.verify re-runs
the patched copy on real ranks. The remedies live by family (gradients, data, replicas,
collectives, memory); syntax.py holds what they share.
"""

from __future__ import annotations

from typing import Callable

from distdoctor.fixing.collectives import alternate_the_pair, evaluate_the_module
from distdoctor.fixing.data import set_the_epoch, shard_the_loader
from distdoctor.fixing.gradients import (
    average_the_sum,
    sync_the_last,
    sync_the_last_instead,
    wait_before_step,
)
from distdoctor.fixing.guards import (
    agree_on_the_skip,
    agree_on_the_steps,
    join_the_uneven,
    out_of_the_guard,
)
from distdoctor.fixing.memory import partition_the_optimizer_state
from distdoctor.fixing.replicas import (
    broadcast_after_construction,
    broadcast_the_buffers,
    find_unused,
)

Remedy = Callable[[str, int, tuple[int, ...]], "str | None"]


def first_of(*remedies: Remedy) -> Remedy:
    """One remedy from several for a cause of several shapes: the first that edits, the
    most specific first (a forward through the DDP wrapper under a rank guard is evaluated
    through its module before any call is moved out of the guard)."""
    def remedy(source: str, line: int, also: tuple[int, ...] = ()) -> str | None:
        return next((edited for r in remedies
                     if (edited := r(source, line, also)) not in (None, source)), None)
    remedy.__doc__ = " / ".join(r.__name__ for r in remedies)
    return remedy


# the remedies by the cause they cure (models.CauseKind)
REMEDIES: dict[str, Remedy] = {
    "sum-without-mean": average_the_sum,
    "repeated-epoch-order": set_the_epoch,
    "unused-params": find_unused,
    "over-memory-budget": partition_the_optimizer_state,
    "failed-sync": wait_before_step,
    "divergent-parameters": broadcast_after_construction,
    "p2p-cycle": alternate_the_pair,
    "duplicate-samples": shard_the_loader,
    "collective-mismatch": first_of(evaluate_the_module, out_of_the_guard),
    "allreduce-every-microbatch": sync_the_last,
    "rank-dependent-update": out_of_the_guard,
    "partial-step": agree_on_the_skip,
    "rank-exited-early": first_of(join_the_uneven, agree_on_the_steps),
    "divergent-buffers": broadcast_the_buffers,
    "unsynced-microbatches": sync_the_last_instead,
}
