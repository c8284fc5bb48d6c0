"""Each rank's traced calls on one time axis: a bar from entry to return, sends joined to
their receives, the calls still open when the ranks were stopped drawn to the end and
marked. Large runs keep each rank's last calls (where a hang is) and fold the earlier
ones into one grey block, and the page says so."""

from __future__ import annotations

from dataclasses import dataclass

from distdoctor.models import Call, RunRecord
from distdoctor.models.calls import SENDS, is_point_to_point
from distdoctor.models.record import STOPPED
from distdoctor.pictures import page
from distdoctor.pictures.svg import COLOURS, legend, line, rect, svg, text

MAX_CALLS = 1500  # bars drawn in all; beyond it each rank keeps its share of the last ones
WIDTH, LEFT, LANE = 1100, 70, 26


@dataclass(frozen=True)
class Bar:
    rank: int
    call: Call
    start: float
    end: float
    open: bool  # still inside it when the ranks were stopped


def kind(call: Call) -> str:
    """How the timeline colours a call: a send, a receive (a batch counts as both: it is
    drawn as a receive), or a collective."""
    if call.op in SENDS:
        return "send"
    return "recv" if is_point_to_point(call.op) else "collective"


def bars(record: RunRecord) -> tuple[list[Bar], float, float]:
    """Every call as a bar, with the run's first entry and last moment."""
    calls = [(r.rank, c) for r in record.ranks for c in r.evidence.calls]
    if not calls:
        return [], 0.0, 0.0
    t0 = min(c.entered for _, c in calls)
    ends = [c.completed for _, c in calls if c.completed is not None]
    ends += [record.started + r.end.at for r in record.ranks
             if r.end.at is not None and record.started]
    t1 = max(ends + [c.entered for _, c in calls]) + 1e-3
    out = []
    for rank, call in calls:
        done = call.completed is not None or call.error is not None
        end = call.completed if call.completed is not None else t1
        out.append(Bar(rank, call, call.entered, end, not done and call.blocking))
    return out, t0, t1


def shown(all_bars: list[Bar], ranks: int) -> tuple[list[Bar], dict[int, tuple[float, float, int]]]:
    """The bars drawn, and per rank the span and count of the earlier ones folded."""
    if len(all_bars) <= MAX_CALLS:
        return all_bars, {}
    keep = max(MAX_CALLS // max(ranks, 1), 20)
    kept, folded = [], {}
    for rank in range(ranks):
        mine = sorted((b for b in all_bars if b.rank == rank), key=lambda b: b.start)
        early, late = mine[:-keep], mine[-keep:]
        kept += late
        if early:
            folded[rank] = (early[0].start, early[-1].end, len(early))
    return kept, folded


def pairs(drawn: list[Bar]) -> list[tuple[Bar, Bar]]:
    """Each send joined to the receive that takes it: the k-th send from A to B on a
    channel (group, tag) with the k-th receive on B from A."""
    sends: dict[tuple, list[Bar]] = {}
    recvs: dict[tuple, list[Bar]] = {}
    for bar in sorted(drawn, key=lambda b: b.start):
        c = bar.call
        if kind(c) == "send":
            sends.setdefault((bar.rank, c.peer, c.pg, c.tag), []).append(bar)
        elif kind(c) == "recv":
            recvs.setdefault((c.peer, bar.rank, c.pg, c.tag), []).append(bar)
    return [(s, r) for key, ss in sends.items() for s, r in zip(ss, recvs.get(key, []))]


def picture(record: RunRecord) -> page.Section | None:
    all_bars, t0, t1 = bars(record)
    if not all_bars:
        return None
    n = len(record.ranks)
    drawn, folded = shown(all_bars, n)
    lane = LANE if n <= 16 else 14
    top = 34
    height = top + lane * n + 30
    scale = (WIDTH - LEFT - 20) / max(t1 - t0, 1e-9)

    def x(t: float) -> float:
        return LEFT + (t - t0) * scale

    body = legend([("collective", COLOURS["collective"]), ("send", COLOURS["send"]),
                   ("recv", COLOURS["recv"]), ("blocked when stopped", COLOURS["blocked"]),
                   ("earlier calls, folded", COLOURS["grid"])], LEFT, 16)
    for rank in range(n):
        y = top + rank * lane
        body.append(text(LEFT - 8, y + lane * 0.6, f"rank {rank}", 11, "end"))
        body.append(line(LEFT, y + lane - 2, WIDTH - 20, y + lane - 2, COLOURS["grid"]))
        if rank in folded:
            start, end, count = folded[rank]
            body.append(rect(x(start), y + 3, x(end) - x(start), lane - 8, COLOURS["grid"],
                             f"rank {rank}: {count} earlier calls, not drawn one by one"))
    for bar in drawn:
        y = top + bar.rank * lane
        c = bar.call
        tip = (f"rank {bar.rank}: {c.op} #{c.seq}"
               + (f" peer {c.peer}" if c.peer is not None else "")
               + f" at {c.where}; {1000 * (bar.end - bar.start):.1f} ms"
               + (" (still blocked when the ranks were stopped)" if bar.open else ""))
        colour = COLOURS["blocked"] if bar.open else COLOURS[kind(c)]
        body.append(rect(x(bar.start), y + 3, x(bar.end) - x(bar.start), lane - 8, colour,
                         tip, "blocked" if bar.open else "call"))
        words = c.op + (f" {'to' if kind(c) == 'send' else 'from'} {c.peer}"
                        if kind(c) != "collective" and c.peer is not None else "")
        if bar.open:
            words += ": blocked"
        if x(bar.end) - x(bar.start) > 7 * len(words) + 8 and lane >= 20:
            body.append(text(x(bar.start) + 4, y + lane * 0.6, words, 10, "start", "#ffffff",
                             "bold"))
    for rank in range(n):  # waiting in a collective torch made itself (DDP's): untraced
        rank_end = record.ranks[rank].end
        if rank_end.collective and rank_end.status in STOPPED:
            mine = [b.end for b in all_bars if b.rank == rank]
            start = max(mine) if mine else t0
            y = top + rank * lane
            body.append(rect(x(start), y + 3, x(t1) - x(start), lane - 8, "#f3d6d7",
                             f"rank {rank}: {rank_end.collective}", "blocked",
                             stroke=COLOURS["blocked"]))
            words = rank_end.collective.split(" (")[0]
            if lane >= 20:
                body.append(text(x(start) + 6, y + lane * 0.6, words + " (untraced)", 10,
                                 colour=COLOURS["blocked"], weight="bold"))
    for send, recv in pairs(drawn):
        body.append(line(x(send.start), top + send.rank * lane + lane / 2,
                         x(recv.end), top + recv.rank * lane + lane / 2, "#555555", 1, "3,2",
                         tip=f"rank {send.rank} -> rank {recv.rank}"))
    body.append(text(LEFT, height - 8, "0 s", 11))
    body.append(text(WIDTH - 20, height - 8, f"{t1 - t0:.3f} s after the first call", 11,
                     "end"))
    html = f'<div class="figure">{svg(WIDTH, height, body, "rank timeline")}</div>'
    notes = []
    if folded:
        notes.append(f"{len(all_bars)} calls in all: each rank's last {len(drawn) // n} or so "
                     f"are drawn one by one, the earlier ones folded into a grey block.")
    notes.append("Hover a bar for its call and the line that made it.")
    html += "".join(page.paragraph(note, "note") for note in notes)
    blocked = sorted((b for b in all_bars if b.open), key=lambda b: b.rank)
    if blocked:
        html += page.table(["rank", "blocked in", "at"],
                           [[str(b.rank), f"{b.call.op} #{b.call.seq}"
                             + (f" peer {b.call.peer}" if b.call.peer is not None else ""),
                             b.call.wait_where or b.call.where] for b in blocked])
    return page.Section("Rank timeline", "timeline", html)
