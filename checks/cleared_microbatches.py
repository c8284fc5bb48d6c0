"""Does each optimiser step apply the sum of all its micro-batches? Accumulation adds each
micro-batch's gradient to the last; a ``zero_grad()`` between them clears the ones before,
so every step applies its last micro-batch alone. Nothing fails and DDP still syncs each
backward (so allreduce_every_microbatch sees the traffic), but the step is k times
smaller and k times noisier than the script means, and ``no_sync()`` would not cure it.

Read from the DDP forwards between two optimiser steps (a step's micro-batches, as
allreduce_every_microbatch reads them) and the ``zero_grad()`` calls that cleared a
gradient the DDP model held (trace/clearing.py): a clear after a forward of the step
whose backward had run, and before the step, threw that micro-batch away (a clear just
before ``optimizer.step()`` throws all of them away: the step applies nothing). Like
accumulation itself, this is how a loop is written, so it shows in most of its steps: a
clear in half of the steps or fewer is a batch passed over (a backward whose step was
skipped, then the next batch), not the loop's habit. Steps a GradScaler skipped are not
judged, nor steps whose weights changed between their forwards (torch's count of in-place
changes to a parameter, recorded with each forward): sharpness-aware minimisation clears
its first gradient, moves the weights and runs a second forward, on purpose.
"""

from __future__ import annotations

from distdoctor.analysis.forwards import completed_steps
from distdoctor.models import Evidence, Finding, RunRecord
from distdoctor.models.calls import ranks_phrase, relative_line

NAME = "cleared_microbatches"


def check(record: RunRecord) -> list[Finding]:
    if any(r.evidence.steps for r in record.ranks):
        return []  # the built-in workload: its steps say what it accumulated
    lost: dict[int, list[tuple[int, int, int]]] = {}  # rank -> (step, forwards, applied)
    where = ""
    for rank in record.ranks:
        found, line = _cleared_steps(rank.evidence)
        if found:
            lost[rank.rank], where = found, where or line
    if not lost:
        return []
    first = min(step for steps in lost.values() for step, _, _ in steps) + 1
    micro = max(forwards for steps in lost.values() for _, forwards, _ in steps)
    applied = max(kept for steps in lost.values() for _, _, kept in steps)
    line = relative_line(where)
    return [Finding(
        check=NAME, fault="cleared-microbatches", kind="cleared-microbatches",
        headline=f"{applied} of {micro} micro-batches applied a step",
        symptom=f"each optimiser step ran {micro} micro-batches, but zero_grad() at {line} "
                f"cleared what they had accumulated before the step, so it applied "
                f"{_applied(applied)} on "
                f"{ranks_phrase(lost)} "
                f"({sum(map(len, lost.values()))} such steps in all, from step {first})",
        cause="zero_grad() inside the micro-batch loop: each call clears the gradients the "
              "micro-batches before it accumulated",
        fix=f"call zero_grad() once per optimiser step, after optimizer.step() (or before "
            f"the first micro-batch), not inside the micro-batch loop at {line}",
        fix_changes={}, ranks=tuple(sorted(lost)), first_step=first, where=(where,),
        measured={"first_step": first, "micro_batches": micro, "applied_micro_batches": applied,
                  "steps": {str(r): [s + 1 for s, _, _ in steps]
                            for r, steps in sorted(lost.items())}, "where": line})]


def _applied(kept: int) -> str:
    return {0: "none of them", 1: "only its last"}.get(kept, f"only its last {kept}")


def _cleared_steps(evidence: Evidence) -> tuple[list[tuple[int, int, int]], str]:
    """The steps (optimiser steps before them) whose micro-batches a clear threw away,
    each with its forwards and how many of them it applied (those after its last clear),
    when that is the loop's
    habit; and the line of the first such clear."""
    backwards = sorted(p.start for p in evidence.phases if p.kind == "backward")
    skipped = {s.steps_before for s in evidence.skipped}
    stepped = completed_steps(evidence)
    forwards: dict[int, list[float]] = {}
    versions: dict[int, set] = {}
    for forward in evidence.ddp_forwards:
        if forward.t is not None:
            forwards.setdefault(forward.steps_before, []).append(forward.t)
            versions.setdefault(forward.steps_before, set()).add(forward.version)
    # micro-batches are forwards at one set of weights: a step whose weights changed
    # between its forwards (sharpness-aware minimisation's perturbation) is another loop
    judged = [step for step in forwards if step in stepped and step not in skipped
              and len(versions[step]) == 1]
    found, where = [], ""
    for step in judged:
        times = sorted(forwards[step])
        clears = [c for c in evidence.cleared if c.steps_before == step and any(
            t < c.t and any(t < b < c.t for b in backwards) for t in times)]
        if clears and len(times) > 1:  # (one forward: its backwards, a loss at a time,
            # each gradient kept by hand before the next: no micro-batch to accumulate)
            kept = sum(t > clears[-1].t for t in times)
            found.append((step, len(times), kept))
            where = where or clears[0].where
    if 2 * len(found) <= len(judged):  # a batch passed over now and then: not the habit
        return [], ""
    return found, where
