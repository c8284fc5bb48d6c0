"""Training curves and memory bars: loss per rank per step, parameter spread across ranks
and distance from the single-process run per step (log scale), with the step a finding
starts at marked; bytes held per rank by kind, against the stage's formula and the
budget."""

from __future__ import annotations

import math
from typing import Sequence

from distdoctor.models import RunRecord
from distdoctor.pictures import page
from distdoctor.pictures.svg import COLOURS, SERIES, legend, line, polyline, rect, svg, text

W, H, LEFT, TOP, BOTTOM = 540, 240, 64, 30, 34
FLOOR = 1e-12  # where zero is drawn on a log scale
FLAT = 1e-12  # a series spanning less is drawn flat, across the middle


def line_chart(series: Sequence[tuple[str, Sequence[tuple[float, float]]]], label: str,
               log: bool = False, marks: Sequence[tuple[float, str]] = ()) -> str:
    points = [p for _, pts in series for p in pts]
    if not points:
        return ""
    xs = [x for x, _ in points]

    def value(y: float) -> float:
        return math.log10(max(abs(y), FLOOR)) if log else y

    ys = [value(y) for _, y in points if math.isfinite(y)] or [0.0]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = min(ys), max(ys)
    if y1 - y0 < FLAT:  # a flat series, drawn across the middle
        pad = 1.0 if log else max(abs(y0) * 0.1, FLAT)
        y0, y1 = y0 - pad, y1 + pad

    def at(x: float, y: float) -> tuple[float, float]:
        yy = value(y) if math.isfinite(y) else y1
        return (LEFT + (x - x0) / (x1 - x0) * (W - LEFT - 16),
                TOP + (1 - (yy - y0) / (y1 - y0)) * (H - TOP - BOTTOM))

    body = [line(LEFT, H - BOTTOM, W - 16, H - BOTTOM, "#999999"),
            line(LEFT, TOP, LEFT, H - BOTTOM, "#999999"), text(LEFT, 16, label, 12,
                                                               weight="bold")]
    for y in (y0, y1):
        real = 10 ** y if log else y
        shown = "0" if log and y <= math.log10(FLOOR) else f"{real:.3g}"
        body.append(text(LEFT - 6, at(x0, real)[1] + 4, shown, 10, "end"))
    body += [text(LEFT, H - 12, f"step {x0:g}", 10), text(W - 16, H - 12, f"step {x1:g}", 10,
                                                          "end")]
    for x, words in marks:
        px, _ = at(min(max(x, x0), x1), 10 ** y0 if log else y0)  # before step 1: at its start
        body += [line(px, TOP, px, H - BOTTOM, COLOURS["blocked"], 1.5, "4,3", tip=words),
                 text(px + 4, TOP + 10, words, 10, colour=COLOURS["blocked"])]
    for i, (name, pts) in enumerate(series):
        colour = SERIES[i % len(SERIES)]
        body.append(polyline([at(x, y) for x, y in pts], colour, name))
    height = H
    if len(series) > 1:  # under the axis, where no curve can hide it
        body += legend([(name, SERIES[i % len(SERIES)]) for i, (name, _) in
                        enumerate(series[:8])], LEFT, H + 8)
        height += 16
    return f'<div class="figure small">{svg(W, height, body, label)}</div>'


def training(record: RunRecord, reference_per_step: tuple[float, ...] = (),
             findings=()) -> page.Section | None:
    from distdoctor.analysis.distance import spreads

    losses = [(f"rank {r.rank}", [(s.step, s.loss) for s in r.evidence.steps])
              for r in record.ranks if r.evidence.steps]
    if not losses:
        return None
    at_step: dict[float, list[str]] = {}  # findings starting at one step share one mark
    for f in findings:
        step = f.first_step
        if step is not None and f.fault not in at_step.setdefault(float(step), []):
            at_step[float(step)].append(f.fault)
    marks = [(step, f"{', '.join(names)} from step {step:g}")
             for step, names in sorted(at_step.items())]
    html = line_chart(losses, "loss per rank per step", marks=marks)
    spread = spreads(record)
    if spread and max(spread) > 0:
        html += line_chart([("spread", list(enumerate(spread)))],
                           "parameter spread across ranks per step (log)", log=True,
                           marks=marks)
    elif spread:
        html += page.paragraph(f"Parameter spread across ranks: 0 at every step "
                               f"(0 to {len(spread) - 1}): the replicas agree.", "note")
    if reference_per_step and max(reference_per_step) > 0:
        html += line_chart([("difference", list(enumerate(reference_per_step)))],  # 0: built
                           "largest difference from the single-process run (log)", log=True)
    elif reference_per_step:
        html += page.paragraph("Largest difference from the single-process run: 0 at every "
                               "step.", "note")
    return page.Section("Training", "training", html)


def memory(record: RunRecord, optimizer: str = "adam") -> page.Section | None:
    from distdoctor.memory.measured import formula_range

    held = [(r.rank, r.evidence.memory[-1]) for r in record.ranks if r.evidence.memory]
    if not held:
        return None
    kinds = ("params", "grads", "optimizer", "gathered")
    top = max([m.total for _, m in held] + [m.budget for _, m in held]
              + [formula_range(m, optimizer)[1] for _, m in held]) or 1
    lane, width = 28, 760
    height = 40 + lane * len(held) + 20
    scale = (width - 90 - 80) / top  # room for the total after the longest bar
    body = legend([(k, COLOURS[k]) for k in kinds] + [("stage formula", "#222222"),
                                                      ("budget", COLOURS["blocked"])], 80, 16)
    for i, (rank, m) in enumerate(held):
        y, x = 34 + i * lane, 80.0
        body.append(text(72, y + 15, f"rank {rank}", 11, "end"))
        for k in kinds:
            size = getattr(m, k)
            body.append(rect(x, y + 2, size * scale, lane - 8, COLOURS[k],
                             f"rank {rank} {k}: {size} bytes"))
            x += size * scale
        low, high = formula_range(m, optimizer)
        body.append(line(80 + high * scale, y, 80 + high * scale, y + lane - 4, "#222222", 2,
                         tip=f"stage {m.stage} formula: {low}-{high} bytes"))
        if m.budget:
            body.append(line(80 + m.budget * scale, y - 2, 80 + m.budget * scale, y + lane - 2,
                             COLOURS["blocked"], 2, "4,2", tip=f"budget: {m.budget} bytes"))
        right = max(m.total, high, m.budget)
        body.append(text(86 + right * scale, y + 15, f"{m.total} B", 10))
    html = f'<div class="figure">{svg(width, height, body, "memory per rank")}</div>'
    html += page.paragraph("Bytes each rank held after its last step, by kind, measured from "
                           "the tensors' own storage; the black tick is the stage's formula, "
                           "the red dashes the budget.", "note")
    return page.Section("Memory", "memory", html)
