"""Plain-text renderings of records, assessments and verdicts for the terminal."""

from __future__ import annotations

import math
import os

from distdoctor.analysis.distance import spreads
from distdoctor.models import Assessment, Finding, RunRecord, RunReport, Verdict
from distdoctor.text import ranks_line, wrap


def num(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isinf(value)):
        return "-"
    return "0" if value == 0 else f"{value:.2e}"


def changes_text(changes: dict) -> str:
    return ", ".join(f"{path}={value}" for path, value in changes.items())


def step_table(record: RunRecord, assessment: Assessment) -> str:
    """One row per step: loss on every rank, spread across ranks, distance from reference."""
    n = record.spec.world_size
    spread = spreads(record)
    reference = assessment.reference.per_step if assessment.reference else ()
    loss_width = max(len("(after construction)"), 8 * n - 1)
    rows = [f"{'step':>4}  {'epoch':>5}  {'loss per rank':<{loss_width}}  "
            f"{'spread':>8}  {'vs 1-proc':>9}"]
    for index in range(record.spec.num_steps + 1):
        losses, epoch = [], "-"
        for rank in record.ranks:
            steps = rank.evidence.steps
            if index and index <= len(steps):
                losses.append(f"{steps[index - 1].loss:7.4f}")
                epoch = str(steps[index - 1].epoch)
            elif index:
                losses.append(f"{'-':>7}")
        loss_text = " ".join(losses) if index else "(after construction)"
        rows.append(f"{index:>4}  {epoch:>5}  {loss_text:<{loss_width}}  "
                    f"{num(spread[index] if index < len(spread) else None):>8}  "
                    f"{num(reference[index] if index < len(reference) else None):>9}")
    return "\n".join(rows)


def numbers_line(assessment: Assessment) -> str:
    reference = assessment.reference
    spread = ("" if assessment.param_spread is None else
              f"spread across ranks {num(assessment.param_spread)} "
              f"(limit {assessment.spread_tolerance:g}), ")
    return (f"{spread}largest difference from the single-process run "
            f"{num(reference.max_abs_diff if reference else None)} "
            f"(limit {reference.tolerance if reference else 0:g})")


def hang_timing(record: RunRecord, printed_at: float) -> str | None:
    """For a hung run: when the ranks blocked, when the hang was declared, and how long
    until the diagnosis was printed (all measured on the machine-wide monotonic clock)."""
    hung = [r for r in record.ranks if r.end.status == "hung"]
    joining = [r.evidence.startup.t for r in hung
               if r.evidence.startup is not None and not r.evidence.startup.joined]
    entered = [c.entered for r in hung for c in r.evidence.calls if c.blocking] + joining
    if not hung or not entered:
        return None
    blocked = max(entered)
    declared = record.started + max(r.end.at or 0.0 for r in hung)
    from distdoctor.analysis.waitfor import PROVEN

    proof = "the ranks' start-ups" if joining else "the calls"
    how = (f"proven from {proof}" if any((r.end.error or "").startswith(PROVEN) for r in hung)
           else "declared at the deadline")
    return (f"hang: the last rank blocked {blocked - record.started:.2f} s into the run; the "
            f"hang was {how} {declared - blocked:.2f} s later (deadline "
            f"{record.spec.deadline:g} s) and this diagnosis printed {printed_at - blocked:.2f} s "
            f"after the ranks blocked (gloo's own timeout: 30 minutes)")


def verdict_line(verdict: Verdict) -> str:
    final = verdict.final
    findings = len(final.findings)
    label = "INCONCLUSIVE" if verdict.outcome == "inconclusive" else \
        "PASS" if verdict.passed else "FAIL"
    text = (f"{label}: {numbers_line(final)}, {findings} finding{'s' * (findings != 1)}")
    if final.undecided:
        text += f" ({len(final.undecided)} undecided)"
    return text if final.ranks_finished else text + ", not every rank finished"


def step_time(record: RunRecord) -> float | None:
    """Median wall time of a pipeline step across all ranks (steps after the first)."""
    spans = []
    steps = {s.step for r in record.ranks for s in r.evidence.pipe_steps}
    for step in sorted(steps)[1:] or sorted(steps):
        mine = [s for r in record.ranks for s in r.evidence.pipe_steps if s.step == step]
        spans.append(max(s.end for s in mine) - min(s.start for s in mine))
    return sorted(spans)[len(spans) // 2] if spans else None


def finding_text(found: Finding, indent: str = "  ") -> str:
    ranks = f", ranks {', '.join(map(str, found.ranks))}" if found.ranks else ""
    lines = [f"{indent}finding [{found.check}] {found.fault}{ranks}: {found.headline}",
             wrap(found.symptom, indent + "  "),
             wrap("cause: " + found.cause, indent + "  ")]
    fix = "fix: " + found.fix
    if found.fix_changes:
        fix += f" (as changes: {changes_text(found.fix_changes)})"
    lines.append(wrap(fix, indent + "  "))
    return "\n".join(lines)


def run_section(title: str, record: RunRecord, assessment: Assessment) -> str:
    lines = [title, "  ranks: " + ranks_line(record)]
    lines += [finding_text(f) for f in assessment.findings] or ["  no findings"]
    lines.append(wrap(numbers_line(assessment), "  "))
    memory = memory_line(record)
    if memory:
        lines.append(wrap(memory, "  "))
    return "\n".join(lines)


def memory_line(record: RunRecord) -> str | None:
    """The most any rank held at its last recorded step, state by state, and the budget."""
    last = [r.evidence.memory[-1] for r in record.ranks if r.evidence.memory]
    if not last:
        return None
    top = max(last, key=lambda m: m.total)
    text = (f"memory held per rank (measured from tensor storage): at most {top.total} bytes "
            f"(parameters {top.params}, gradients {top.grads}, optimiser {top.optimizer}, "
            f"gathered {top.gathered})")
    if top.budget:
        text += f", budget {top.budget} bytes: " + ("fits" if top.total <= top.budget else
                                                     f"over by {top.total - top.budget}")
    return text


OUTCOME_TEXT = {
    "fixed": "FIXED: detected, fixed, and the fixed run matches the single-process reference",
    "not-fixed": "NOT FIXED: the fix was applied but the run is still not healthy",
    "masked": "MASKED: the strategy prevents this fault, and the run shows it",
    "not-reproduced": "NOT REPRODUCED: no detector fired",
    "inconclusive": "INCONCLUSIVE: a timing judgement stayed undecided after measuring more "
                    "steps; its interval straddles the limit",
    "healthy": "HEALTHY",
    "unhealthy": "UNHEALTHY",
}


def diagnosis_text(report: RunReport) -> str:
    verdict = report.verdict
    sections = [run_section("the faulty run", report.record, verdict.before)]
    if report.fixed_record is not None and verdict.after is not None:
        sections.append(run_section(f"after the fix ({verdict.note.removeprefix('applied ')})",
                                    report.fixed_record, verdict.after))
    if report.fixed_record is not None and report.record.spec.is_pipeline:
        before, after = step_time(report.record), step_time(report.fixed_record)
        if before and after:
            text = (f"step time: {before * 1e3:.1f} ms before the fix, {after * 1e3:.1f} ms "
                    f"after: {before / after:.2f}x (median over steps, measured in this run)")
            cores = os.cpu_count() or 1
            if report.record.spec.world_size > cores:
                text += (f"; {report.record.spec.world_size} ranks share {cores} cores here, "
                         f"so idle ranks lend their core to the slow one and balance shows in "
                         f"the stage times more than in the step time")
            sections.append(wrap(text))
    closing = "verdict: " + OUTCOME_TEXT[verdict.outcome]
    if verdict.note and verdict.outcome in ("masked", "not-reproduced", "not-fixed",
                                            "inconclusive"):
        closing += "\n" + wrap(verdict.note, "  ")
    return "\n\n".join(sections + [closing])


def rank_ends(record: RunRecord) -> str:
    """What happened to every rank that did not finish, with tracebacks and stacks."""
    lines = []
    for rank in record.ranks:
        end = rank.end
        if end.ok:
            continue
        lines.append(f"rank {end.rank}: {end.status}")
        if end.error:
            lines.append("  " + end.error.strip().replace("\n", "\n  "))
        for stack in end.stacks:
            lines.append("  " + str(stack).replace("\n", "\n  "))
    return "\n".join(lines)


def traffic_line(record: RunRecord) -> str | None:
    """What each process group's collectives moved per step on rank 0, by purpose (the
    tensor-parallel strategies record it; torch's DTensor collectives are not counted):
    the mean over the steps it completed."""
    if not record.ranks or not record.ranks[0].evidence.traffic:
        return None
    by_purpose: dict[str, list] = {}
    for t in record.ranks[0].evidence.traffic:
        if len(t.group) > 1:  # a group of one moves nothing
            by_purpose.setdefault(t.purpose, []).append(t)
    if not by_purpose:
        return None
    names = {"tensor": "tensor-parallel group", "data": "replicas' average"}
    parts = []
    for purpose, rows in by_purpose.items():
        calls = sum(t.calls for t in rows) / len(rows)
        sent = sum(t.bytes for t in rows) / len(rows)
        parts.append(f"{names.get(purpose, purpose)} {tuple(rows[0].group)}: "
                      f"{calls:g} collective{'s' if calls != 1 else ''}, {sent:g} B")
    return "bytes per step, rank 0: " + "; ".join(parts)
