"""Pipeline schedules as Gantt charts: one lane per rank, a bar per forward (F), backward
for inputs (B), backward for weights (W), full backward (BW) or overlapped pair (FB), the
micro-batch written in it; the idle gaps are the bubble. Simulated from a schedule, or
measured from a real run's stage events (one step)."""

from __future__ import annotations

from distdoctor.models import RunRecord
from distdoctor.pictures.svg import COLOURS, legend, rect, svg, text

WIDTH, LEFT, LANE = 1100, 70, 26
KINDS = {"F": "F forward", "B": "B backward", "W": "W weight backward",
         "BW": "BW full backward", "FB": "FB forward and backward"}


def chart(lanes: dict[int, list[tuple[float, float, str, int]]], label: str,
          unit: str, span: float | None = None) -> str:
    """``lanes``: rank -> (start, end, kind, micro) bars. ``span``: the time the full width
    stands for, so that charts drawn one above the other compare by length."""
    bars = [b for bs in lanes.values() for b in bs]
    if not bars:
        return ""
    t0, t1 = min(b[0] for b in bars), max(b[1] for b in bars)
    scale = (WIDTH - LEFT - 20) / max(span or (t1 - t0), 1e-12)
    ranks = sorted(lanes)
    height = 40 + LANE * len(ranks) + 24
    body = [text(LEFT, 14, label, 12, weight="bold")]
    body += legend([(KINDS[k], COLOURS[k]) for k in KINDS if any(b[2] == k for b in bars)],
                   LEFT + 8 * len(label) + 20, 14)
    for i, rank in enumerate(ranks):
        y = 28 + i * LANE
        body.append(text(LEFT - 8, y + LANE * 0.6, f"rank {rank}", 11, "end"))
        for start, end, kind, micro in lanes[rank]:
            x, w = LEFT + (start - t0) * scale, (end - start) * scale
            body.append(rect(x, y + 2, w, LANE - 6, COLOURS.get(kind, "#888888"),
                             f"rank {rank}: {kind} of micro-batch {micro}, "
                             f"{start - t0:.3g}-{end - t0:.3g} {unit}"))
            if w > 14:
                body.append(text(x + w / 2, y + LANE * 0.6, str(micro), 10, "middle",
                                 "#ffffff"))
    body.append(text(LEFT + (t1 - t0) * scale, height - 6, f"{t1 - t0:.3g} {unit}", 11,
                     "end"))
    return f'<div class="figure">{svg(WIDTH, height, body, label)}</div>'


def simulated(timeline, span: float | None = None) -> str:
    lanes: dict[int, list] = {r: [] for r in range(timeline.ranks)}
    for slot in timeline.slots:
        action = slot.action
        micro = action.parts[0].micro if action.parts else action.micro
        lanes[slot.rank].append((slot.start, slot.end, action.kind, micro))
    return chart(lanes, f"simulated: {timeline.schedule.name}", "time units", span)


def measured(record: RunRecord) -> str:
    """The last step every rank completed, as the ranks ran it."""
    steps = [{e.step for e in r.evidence.stage_events} for r in record.ranks]
    common = set.intersection(*steps) if steps and all(steps) else set()
    if not common:
        return ""
    step = max(common)
    lanes = {r.rank: [(e.start, e.end, e.kind, e.micro) for e in r.evidence.stage_events
                      if e.step == step] for r in record.ranks}
    return chart(lanes, f"measured: step {step}", "s")
