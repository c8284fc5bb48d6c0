"""Ranks resumed with parameter shards that are not the ones they saved.

What each rank steps (the whole model under DDP, its shard under ZeRO) must read back as
it was saved; a checkpoint that kept one copy for several ranks' different shards hands
them someone else's, and the model trains on from a mixture.
"""

from __future__ import annotations

from distdoctor.analysis.restarts import lost
from distdoctor.checks import finding
from distdoctor.models import Finding, RunRecord
from distdoctor.models.calls import ranks_phrase

NAME = "shards_not_restored"


def check(record: RunRecord) -> list[Finding]:
    found = lost(record, "parameters")
    if found is None:
        return []
    optimizer = lost(record, "optimizer state")
    also = (" and optimiser state" if optimizer is not None and optimizer.step == found.step
            else "")
    return [finding(
        "shards-not-restored", check=NAME,
        headline=f"{len(found.ranks)} ranks resumed with shards not their own",
        symptom=f"after the restart at step {found.step}, {ranks_phrase(found.ranks)} "
                f"hold parameter{also} shards that are not the ones they saved, so the "
                f"model trains on from a mixture of shards",
        fix_changes={"knobs.checkpoint_keys": "per-rank"}, ranks=found.ranks,
        first_step=found.step + 1,
        measured={"restart_after_step": found.step, "ranks_not_restored": list(found.ranks),
                  "parts_lost": ["parameters"] + (["optimizer state"] if also else [])})]
