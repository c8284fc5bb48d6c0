"""Who the others wait for: each rank's arrival at each collective of a group over the
last steps, on one time axis, with the time it waited for the last arriver shaded, and
per rank how often it came last and what that cost the rest (analysis/stragglers.py)."""

from __future__ import annotations

import statistics

from distdoctor.analysis.stragglers import GroupKey, Step, group_steps
from distdoctor.models import RunRecord
from distdoctor.pictures import page
from distdoctor.pictures.svg import COLOURS, legend, line, rect, svg, text

WINDOW = 6  # the last steps drawn: enough to see a pattern, few enough to see each wait
WIDTH, LEFT, LANE = 1100, 70, 22
LATE = COLOURS["blocked"]


def picture(record: RunRecord) -> page.Section | None:
    groups = group_steps(record)
    if not groups:
        return None
    html = "".join(_group(key, steps) for key, steps in sorted(
        groups.items(), key=lambda kv: (-len(kv[0][1]), kv[0][0] or "")))
    return page.Section("Arrivals", "arrivals", html)


def _group(key: GroupKey, steps: list[Step]) -> str:
    members = key[1]
    window = steps[-WINDOW:]
    times = [t for s in window for c in s.collectives for t in c.arrived.values()]
    t0, t1 = min(times), max(times) + 1e-4
    scale = (WIDTH - LEFT - 20) / (t1 - t0)
    top = 34
    height = top + LANE * len(members) + 30

    def x(t: float) -> float:
        return LEFT + (t - t0) * scale

    body = legend([("waiting for the last arriver", COLOURS["wait"]),
                   ("arrival", COLOURS["collective"]), ("last to arrive", LATE)], LEFT, 16)
    lane_of = {rank: i for i, rank in enumerate(members)}
    for rank, i in lane_of.items():
        y = top + i * LANE
        body.append(text(LEFT - 8, y + LANE * 0.6, f"rank {rank}", 11, "end"))
        body.append(line(LEFT, y + LANE - 2, WIDTH - 20, y + LANE - 2, COLOURS["grid"]))
    for s in window:
        first = min(min(c.arrived.values()) for c in s.collectives)
        body.append(line(x(first), top - 4, x(first), height - 26, COLOURS["muted"], 1, "2,3"))
        body.append(text(x(first) + 2, height - 14, f"step {s.number}", 10,
                         colour=COLOURS["muted"]))
        for c in s.collectives:
            last, at_last = c.last, max(c.arrived.values())
            for rank, at in c.arrived.items():
                y = top + lane_of[rank] * LANE
                wait = at_last - at
                if wait > 0:
                    body.append(rect(x(at), y + 4, x(at_last) - x(at), LANE - 10,
                                     COLOURS["wait"], f"rank {rank} waited {wait * 1e3:.1f} ms "
                                     f"at {c.op} #{c.seq} (step {s.number}) for rank {last}"))
                body.append(line(x(at), y + 2, x(at), y + LANE - 4,
                                 LATE if rank == last else COLOURS["collective"], 2,
                                 tip=f"rank {rank} entered {c.op} #{c.seq} "
                                     f"(step {s.number})"))
    body.append(text(WIDTH - 20, height - 4, f"{(t1 - t0) * 1e3:.1f} ms", 11, "end"))
    name = "the default group" if key[0] is None else f"process group {key[0]}"
    html = page.paragraph(f"{name}, ranks {', '.join(map(str, members))}: the last "
                          f"{len(window)} of {len(steps)} steps judged", "note")
    html += f'<div class="figure">{svg(WIDTH, height, body, "arrivals")}</div>'
    rows = []
    for rank in members:
        lasts = sum(1 for s in steps if s.last == rank)
        held = statistics.median(s.cost[rank] for s in steps) * 1e3
        rows.append([str(rank), f"{lasts} of {len(steps)}", f"{held:.1f} ms",
                     f"{sum(s.cost[rank] for s in steps) / sum(s.seconds for s in steps):.0%}"])
    return html + page.table(["rank", "last to arrive", "held the others up (median a step)",
                              "share of the steps' time"], rows)
