"""What ``distdoctor demo`` prints: each fault as a short lesson, and the summary of a
whole sweep.

A lesson is a diagnosis told in order: what goes wrong, what was measured, why, the fix,
and the numbers after it. Everything in it comes from the run's own report.
"""

from __future__ import annotations

from dataclasses import dataclass

from distdoctor.analysis.stragglers import waiting
from distdoctor.cli.tables import OUTCOME_TEXT, changes_text, memory_line, num, numbers_line
from distdoctor.faults import Fault
from distdoctor.models import RunReport
from distdoctor.text import ranks_line, wrap


@dataclass(frozen=True)
class DemoRow:
    fault: str
    variant: str
    strategy: str
    world_size: int
    report: RunReport
    seconds: float


def lesson(fault: Fault, report: RunReport) -> str:
    spec = report.record.spec
    variant = fault.variant(report.fault.split(":", 1)[1] if report.fault else None)
    verdict = report.verdict
    before = verdict.before
    reference = before.reference
    paragraphs = [
        f"== {fault.id}: {fault.title} ==",
        wrap(f"What goes wrong: {fault.symptom}. Injected into {spec.strategy} on "
             f"{spec.world_size} {spec.backend} ranks by flipping the built-in workload's "
             f"switches (its knobs): {changes_text(variant.knobs)} ({variant.description})."),
    ]
    if not before.decided:
        undecided = " ".join(f.symptom.rstrip(".") + "." for f in before.undecided)
        paragraphs.append(wrap(
            f"What we measured: {undecided or 'no detector fired;'} {numbers_line(before)}; "
            f"ranks: {ranks_line(report.record)}. {OUTCOME_TEXT[verdict.outcome]}: "
            f"{verdict.note}"))
        return "\n".join(paragraphs)
    measured = " ".join(f.symptom.rstrip(".") + "." for f in before.findings)
    if before.ranks_finished and reference is not None:
        distance = (f"Largest difference from the single-process run: "
                    f"{num(reference.max_abs_diff)} (limit {reference.tolerance:g}).")
    else:
        distance = "The run did not finish, so it has no final parameters to compare."
    paragraphs += [
        wrap(f"What we measured: {measured} Ranks: {ranks_line(report.record)}. {distance}"),
        wrap("Why: " + " ".join(dict.fromkeys(f.cause.rstrip(".") + "." for f in before.decided))),
        wrap("The fix: " + " ".join(dict.fromkeys(f.fix.rstrip(".") + "." for f in before.decided
                                                  if f.fix_changes))
             + f" Applied as {verdict.note.removeprefix('applied ')}."),
    ]
    if verdict.after is not None:
        after = verdict.after
        found = ("no findings" if not after.findings
                 else "still " + "; ".join(f.headline for f in after.findings))
        extra = memory_line(report.fixed_record) if report.fixed_record and any(
            m.budget for r in report.fixed_record.ranks for m in r.evidence.memory) else None
        if report.fixed_record and any(f.kind == "straggler" for f in before.findings):
            extra = waiting(report.fixed_record)  # the wait, gone or not
        paragraphs.append(wrap(f"After the fix: {found}; {numbers_line(after)}"
                               + (f"; {extra}" if extra else "")
                               + f". {OUTCOME_TEXT[verdict.outcome]}."))
    return "\n".join(paragraphs)


def code_lesson_text(taught) -> str:
    """A CodeLesson told: the script, the fix as a diff, the two runs' verdicts."""
    exercise = taught.exercise
    indented = "".join(f"    {line}" if line.strip() else line
                       for line in taught.source.splitlines(keepends=True))
    return "\n".join([
        f"== {exercise.name}: {exercise.title} (from code) ==",
        f"The script with the bug ({exercise.script}; to fix it yourself: "
        f"distdoctor exercise {exercise.name} DIR):",
        indented.rstrip("\n"),
        "The fix, as a diff of it:",
        taught.diff.rstrip("\n"),
        f"Both run on {exercise.ranks(taught.world_size)}" + (
            ", each by resume-check (stopped after its first checkpoint, once through, and "
            "resumed):" if exercise.resumes else ":"),
        wrap(f"with the bug: {run_verdict(taught.before, exercise)}", indent="  "),
        wrap(f"fixed:        {run_verdict(taught.after, exercise)}", indent="  "),
    ])


def run_verdict(run, exercise) -> str:
    """A graded run of ``exercise``'s script in a line: its first cause with the
    detector's numbers, undecided where an open timing judgement decides it (as the grader
    has it), or OK."""
    from distdoctor.teaching.grading import deciding, open_note

    if run.causes:
        kind, summary = run.causes[0]
        return f"FAILED: {kind}: {summary}"
    if not run.finished:
        return "FAILED: a rank did not finish"
    if deciding(exercise.name, run):
        return f"UNDECIDED (the machine too busy to judge with a margin): {run.undecided[0]}"
    note = open_note(run.undecided[0]) if run.undecided else ""
    if exercise.resumes:
        return f"OK: resumed from its checkpoint, it trains like the run that never stopped{note}"
    return f"OK: every rank finished and no detector found a cause{note}"


def masked_note(report: RunReport) -> str:
    """One paragraph for a strategy on which the fault cannot happen, with the evidence."""
    spec = report.record.spec
    return wrap(f"On {spec.strategy}: {OUTCOME_TEXT[report.verdict.outcome]}. "
                f"{report.verdict.note}.")


def summary_table(rows: list[DemoRow]) -> str:
    width = max([len("strategy")] + [len(r.strategy) for r in rows])
    vwidth = max([len("variant")] + [len(r.variant) for r in rows])
    header = (f"{'fault':<27} {'variant':<{vwidth}} {'strategy':<{width}} {'N':>2}  "
              f"{'measured before the fix':<42} {'|Δ| before':>10} {'|Δ| after':>9}  outcome")
    lines = [header, "-" * len(header)]
    for row in rows:
        verdict = row.report.verdict
        before = verdict.before
        measured = "; ".join(f.headline for f in before.findings if f.fault == row.fault) \
            or "; ".join(f.headline for f in before.findings) or "no finding"
        after = verdict.after.reference.max_abs_diff if verdict.after and verdict.after.reference \
            else (before.reference.max_abs_diff if before.reference else None)
        lines.append(
            f"{row.fault:<27} {row.variant:<{vwidth}} {row.strategy:<{width}} "
            f"{row.world_size:>2}  "
            f"{measured[:42]:<42} "
            f"{num(before.reference.max_abs_diff if before.reference else None):>10} "
            f"{num(after):>9}  {verdict.outcome}")
    passed = sum(r.report.verdict.passed for r in rows)
    seconds = sum(r.seconds for r in rows)
    lines.append("|Δ|: largest parameter difference from the single-process run "
                 "('-': the run did not finish)")
    lines.append(f"{passed} of {len(rows)} detected and fixed, or masked by the strategy as "
                 f"expected; {seconds:.1f} s of diagnosis")
    return "\n".join(lines)
