"""Some ranks resumed with optimiser state they did not save, their parameters intact.

Adam's moments and step count, and the learning rate in its parameter groups, are part of
what a run that never stopped holds: a rank that resumes without them takes different
updates. Parameters lost as well point at the checkpoint's shards instead
(shards_not_restored), which this leaves to that check.
"""

from __future__ import annotations

from distdoctor.analysis.restarts import lost
from distdoctor.checks import finding
from distdoctor.models import Finding, RunRecord
from distdoctor.models.calls import ranks_phrase

NAME = "optimizer_state_not_restored"


def check(record: RunRecord) -> list[Finding]:
    found = lost(record, "optimizer state")
    params = lost(record, "parameters")
    if found is None or (params is not None and params.step == found.step):
        return []
    kept = f" while {ranks_phrase(found.kept)} did" if found.kept else ""
    return [finding(
        "optimizer-state-not-restored", check=NAME,
        headline=f"optimiser state of {ranks_phrase(found.ranks)} not restored",
        symptom=f"after the restart at step {found.step}, {ranks_phrase(found.ranks)} "
                f"resumed with optimiser state that is not what they saved{kept}: their "
                f"updates differ from the run that never stopped",
        fix_changes={"knobs.restored_optimizer": "every-rank"}, ranks=found.ranks,
        first_step=found.step + 1,
        measured={"restart_after_step": found.step, "ranks_not_restored": list(found.ranks),
                  "ranks_restored": list(found.kept)})]
