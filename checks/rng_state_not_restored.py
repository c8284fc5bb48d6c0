"""A rank resumed with an RNG state that is not the one it saved.

Each rank's RNG state at a checkpoint is its own (per-rank seeds for augmentation and
dropout); a resume that reads back another one makes every later draw differ from the run
that never stopped. Named with whose state the ranks got, when it is one of theirs.
"""

from __future__ import annotations

from distdoctor.analysis.restarts import lost
from distdoctor.checks import finding
from distdoctor.models import Finding, RunRecord
from distdoctor.models.calls import ranks_phrase

NAME = "rng_state_not_restored"


def check(record: RunRecord) -> list[Finding]:
    found = lost(record, "RNG state")
    if found is None:
        return []
    sources = sorted({other for _, other in found.got})
    whose = (f": they resumed with rank {sources[0]}'s" if len(sources) == 1 and found.got
             and len(found.got) == len(found.ranks) else "")
    return [finding(
        "rng-state-not-restored", check=NAME,
        headline=f"RNG state of {len(found.ranks)} of {len(found.ranks) + len(found.kept)} "
                 f"ranks not theirs after restart",
        symptom=f"after the restart at step {found.step}, {ranks_phrase(found.ranks)} "
                f"loaded an RNG state that is not the one they saved{whose}; every random "
                f"draw from then on differs from the run that never stopped",
        fix_changes={"knobs.restored_rng": "per-rank"}, ranks=found.ranks,
        first_step=found.step + 1,
        measured={"restart_after_step": found.step, "ranks_not_restored": list(found.ranks),
                  "resumed_with": {str(rank): other for rank, other in found.got}})]
