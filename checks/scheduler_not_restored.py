"""The learning-rate scheduler read back a different count of steps than it saved.

A closed-form schedule (warm-up, decay) sets the learning rate from its count of steps, so
a scheduler that restarts at 0 after a resume starts its schedule over.
"""

from __future__ import annotations

from distdoctor.analysis.restarts import lost
from distdoctor.checks import finding
from distdoctor.models import Finding, RunRecord
from distdoctor.models.calls import ranks_phrase

NAME = "scheduler_not_restored"


def check(record: RunRecord) -> list[Finding]:
    found = lost(record, "scheduler")
    if found is None:
        return []
    evidence = dict(found.restarts)[found.ranks[0]]
    saved, restored = evidence.scheduler_saved, evidence.scheduler_restored
    return [finding(
        "scheduler-not-restored", check=NAME,
        headline=f"scheduler at step {restored}, not {saved}, after restart",
        symptom=f"after the restart at step {found.step}, the learning-rate scheduler of "
                f"{ranks_phrase(found.ranks)} counts {restored} steps where it had saved "
                f"{saved}: its schedule starts over and every later learning rate differs "
                f"from the run that never stopped",
        fix_changes={"knobs.restore_scheduler": True}, ranks=found.ranks,
        first_step=found.step + 1,
        measured={"restart_after_step": found.step, "scheduler_steps_saved": saved,
                  "scheduler_steps_restored": restored})]
