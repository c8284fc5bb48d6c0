"""Plain-text renderings of records and verdicts for the terminal."""

from __future__ import annotations

import math

from harness.models import RunRecord, Verdict
from harness.reference import spreads


def _num(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isinf(value)):
        return "-"
    return "0" if value == 0 else f"{value:.2e}"


def step_table(record: RunRecord, verdict: Verdict) -> str:
    """One row per step: loss on every rank, spread across ranks, distance from reference."""
    n = record.spec.world_size
    spread = spreads(record)
    reference = verdict.reference.per_step if verdict.reference else ()
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
                    f"{_num(spread[index] if index < len(spread) else None):>8}  "
                    f"{_num(reference[index] if index < len(reference) else None):>9}")
    return "\n".join(rows)


def verdict_line(verdict: Verdict) -> str:
    findings = verdict.findings_after if verdict.findings_after is not None \
        else verdict.findings_before
    reference = verdict.reference
    parts = [
        "PASS" if verdict.passed else "FAIL",
        f"spread across ranks {_num(verdict.param_spread)} (limit {verdict.spread_tolerance:g})",
        f"largest difference from the single-process run "
        f"{_num(reference.max_abs_diff if reference else None)}"
        f" (limit {reference.tolerance if reference else 0:g})",
        f"{len(findings)} finding{'s' * (len(findings) != 1)}",
    ]
    if not verdict.ranks_finished:
        parts.append("not every rank finished")
    return parts[0] + ": " + ", ".join(parts[1:])


def rank_ends(record: RunRecord) -> str:
    """What happened to every rank that did not finish."""
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
