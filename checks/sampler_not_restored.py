"""The loader resumed at another place than it saved: another epoch, or the epoch's start.

Every sample is read once per epoch: a loader that resumes at the start of its epoch reads
again what it read before the restart; one that forgets the epoch replays another epoch's
order. Told apart by the place saved and the place restored.
"""

from __future__ import annotations

from distdoctor.analysis.restarts import lost
from distdoctor.checks import finding
from distdoctor.models import Finding, RunRecord
from distdoctor.models.calls import ranks_phrase

NAME = "sampler_not_restored"


def check(record: RunRecord) -> list[Finding]:
    found = lost(record, "sampler")
    if found is None:
        return []
    evidence = dict(found.restarts)[found.ranks[0]]
    (epoch, read), (epoch_after, read_after) = evidence.sampler_saved, evidence.sampler_restored
    if epoch_after == epoch:
        what = (f"starts epoch {epoch} over at batch {read_after} where it had read {read}: "
                f"{_batches(read - read_after)} of it read twice")
    else:
        what = (f"resumes in epoch {epoch_after} at batch {read_after} where it had saved "
                f"epoch {epoch} at batch {read}: it replays epoch {epoch_after}'s order")
    return [finding(
        "sampler-not-restored", check=NAME,
        headline=f"loader resumed at epoch {epoch_after} batch {read_after}, not {epoch} "
                 f"batch {read}",
        symptom=f"after the restart at step {found.step}, the loader of "
                f"{ranks_phrase(found.ranks)} {what}",
        fix_changes={"knobs.restored_sampler": "epoch-and-position"}, ranks=found.ranks,
        first_step=found.step + 1,
        measured={"restart_after_step": found.step, "saved": {"epoch": epoch, "batch": read},
                  "restored": {"epoch": epoch_after, "batch": read_after}})]


def _batches(count: int) -> str:
    return f"{count} batch" if count == 1 else f"{count} batches"
