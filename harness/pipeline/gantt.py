"""Gantt charts of a simulated (or measured) pipeline: text always, PNG with matplotlib."""

from __future__ import annotations

from distdoctor.pipeline.simulate import Timeline


def text_gantt(timeline: Timeline, max_width: int = 200) -> str:
    """One row per rank; each quantum of time is 'F3 ' (forward of micro-batch 3), '.'
    when idle. A rank's second stage (interleaved, V-shape, reverse direction) is lower
    case; overlapped F&B pairs show as 'X'."""
    quantum = min(s.end - s.start for s in timeline.slots)
    for part in (timeline.costs.f, timeline.costs.b, timeline.costs.w):
        scaled = part * timeline.schedule.layout.stage_units
        if scaled > 0:
            quantum = min(quantum, scaled)
    width = round(timeline.makespan / quantum)
    micro_digits = len(str(max((s.action.parts or (s.action,))[0].micro for s in timeline.slots)))
    cell = 2 + micro_digits  # kind letter, micro-batch number, a space
    if width * cell > max_width:
        return (f"(chart omitted: {width} time steps would need {width * cell} columns; "
                f"use --png or fewer micro-batches)")
    first_stage: dict = {}
    for slot in timeline.slots:
        first_stage.setdefault(slot.rank, slot.action.parts[0].stage if slot.action.parts
                               else slot.action.stage)
    rows = []
    for rank in range(timeline.ranks):
        cells = ["." + " " * (cell - 1)] * width
        for slot in (s for s in timeline.slots if s.rank == rank):
            action = slot.action
            label = "X" if action.kind == "FB" else action.kind[0]
            stage = action.parts[0].stage if action.parts else action.stage
            if stage != first_stage[rank] and action.kind != "FB":
                label = label.lower()
            micro = action.parts[0].micro if action.parts else action.micro
            text = f"{label}{micro}".ljust(cell)
            for q in range(round(slot.start / quantum), round(slot.end / quantum)):
                cells[q] = text
        rows.append(f"rank {rank:<2} |" + "".join(cells).rstrip())
    return "\n".join(rows)


def png_gantt(timeline: Timeline, path: str) -> bool:
    """Write the chart as PNG; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    colours = {"F": "#4c72b0", "B": "#dd8452", "W": "#55a868", "BW": "#c44e52", "FB": "#8172b3"}
    fig, ax = plt.subplots(figsize=(max(6, timeline.makespan / 3), 0.6 * timeline.ranks + 1))
    for slot in timeline.slots:
        ax.broken_barh([(slot.start, slot.end - slot.start)], (slot.rank - 0.4, 0.8),
                       facecolors=colours[slot.action.kind], edgecolor="white")
        micro = slot.action.parts[0].micro if slot.action.parts else slot.action.micro
        ax.text((slot.start + slot.end) / 2, slot.rank, str(micro), ha="center", va="center",
                fontsize=7, color="white")
    ax.set_yticks(range(timeline.ranks), [f"rank {r}" for r in range(timeline.ranks)])
    ax.invert_yaxis()
    ax.set_xlabel("time")
    ax.set_title(f"{timeline.schedule.name}: bubble {timeline.bubble_fraction:.2%}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
