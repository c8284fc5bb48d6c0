"""Who waits for whom when the ranks hang: ranks on a circle, an arrow from each stopped rank
to each rank it waits for, a cycle of waits in red, a rank waited for that had already
ended (or never joined) ringed in brown."""

from __future__ import annotations

import math

from distdoctor.analysis.waitfor import cycle_of
from distdoctor.models import RunRecord
from distdoctor.pictures import page
from distdoctor.pictures.svg import COLOURS, arrowhead, circle, line, svg, text

SIZE, NODE = 420, 22


def picture(record: RunRecord) -> page.Section | None:
    from distdoctor.analysis.waitfor import wait_edges

    edges = wait_edges(record)
    if not edges:
        return None
    n = len(record.ranks)
    cycle = cycle_of(edges) or []
    in_cycle = {(a, b) for a, b in zip(cycle, cycle[1:] + cycle[:1])}
    ended = {r.rank for r in record.ranks if r.end.status in ("finished", "raised", "died")}
    waited = {peer for peers in edges.values() for peer in peers}
    radius = SIZE / 2 - NODE - 30 if n > 1 else 0
    centre = SIZE / 2
    at = {r: (centre + radius * math.sin(2 * math.pi * r / n),
              centre - radius * math.cos(2 * math.pi * r / n)) for r in range(n)}
    body = [arrowhead("wait", "#555555"), arrowhead("cycle", COLOURS["blocked"])]
    for rank, peers in sorted(edges.items()):
        for peer in sorted(peers):
            (x1, y1), (x2, y2) = at[rank], at[peer]
            length = math.hypot(x2 - x1, y2 - y1) or 1.0
            dx, dy = (x2 - x1) / length, (y2 - y1) / length
            red = (rank, peer) in in_cycle
            # two ranks waiting for each other: two arrows side by side, not one on the other
            side = 5.0 if rank in edges.get(peer, ()) else 0.0
            ox, oy = -dy * side, dx * side
            body.append(line(x1 + dx * NODE + ox, y1 + dy * NODE + oy,
                             x2 - dx * (NODE + 2) + ox, y2 - dy * (NODE + 2) + oy,
                             COLOURS["blocked"] if red else "#555555",
                             3 if red else 1.5, marker="cycle" if red else "wait",
                             tip=f"rank {rank} waits for rank {peer}"))
    for rank, (x, y) in at.items():
        missing = rank in waited and rank in ended
        stroke = (COLOURS["blocked"] if rank in cycle else
                  COLOURS["ended"] if missing else "#555555")
        status = record.ranks[rank].end.status
        body.append(circle(x, y, NODE, "#fbe9e9" if rank in cycle else
                           "#f3ece4" if missing else "#ffffff", stroke,
                           f"rank {rank}: {status}"))
        body.append(text(x, y + 4, str(rank), 13, "middle", weight="bold"))
        if missing:
            body.append(text(x, y + NODE + 14, f"{status}", 11, "middle", COLOURS["ended"]))
    bottom = max(y for _, y in at.values()) + NODE + 24  # no empty band under the nodes
    html = f'<div class="figure">{svg(SIZE, bottom, body, "wait-for graph")}</div>'
    if cycle:
        ring = " -> ".join(map(str, cycle + cycle[:1]))
        html += page.paragraph(f"A cycle of waits: ranks {ring}. None of them can go on.",
                               "note")
    gone = sorted(waited & ended)
    if gone:
        html += page.paragraph(
            "Waited for, but already ended: " + ", ".join(
                f"rank {r} ({record.ranks[r].end.status})" for r in gone) + ".", "note")
    return page.Section("Who waits for whom", "waitgraph", html)
