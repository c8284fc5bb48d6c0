"""Run a schedule's action lists against per-action costs: timelines, bubbles, memory.

List scheduling in start-time order: every rank runs its actions in its list's order, each
as soon as the rank is free and the actions it depends on have finished (communication is
free unless ``Costs.comm`` says a hop between ranks takes time). Costs are per
rank-share of the model, as for 1F1B; a stage that is a fraction of
that (interleaving's chunks, DualPipeV's half-stages) costs that fraction. The closed
forms published for these schedules are computed beside the simulation, so that where a
formula and the schedule disagree, both are shown.
"""

from __future__ import annotations

from dataclasses import dataclass

from distdoctor.pipeline.orders import CHUNKS, Action, Schedule, build


@dataclass(frozen=True)
class Costs:
    """Time of a forward (f), a backward for inputs (b), a backward for weights (w), of an
    overlapped forward+full-backward pair (fb, default f + b + w: compute does not
    overlap, only communication would), and of one hop from a stage to the next when they
    are on different ranks (comm)."""

    f: float = 1.0
    b: float = 1.0
    w: float = 1.0
    fb: float | None = None
    comm: float = 0.0  # latency of one hop between ranks (0: communication is free)
    per_stage: tuple[tuple[float, float, float], ...] = ()  # measured (f, b, w) per stage

    def of(self, kind: str) -> float:
        return {"F": self.f, "B": self.b, "W": self.w, "BW": self.b + self.w,
                "FB": self.fb if self.fb is not None else self.f + self.b + self.w}[kind]

    def duration(self, action: Action, stage_units: float) -> float:
        """How long ``action`` takes: its stage's measured times when there are any (a
        chunk's own time), else the uniform cost scaled to the stage's share."""
        if not self.per_stage:
            return self.of(action.kind) * stage_units
        if action.parts:
            return sum(self.duration(part, stage_units) for part in action.parts)
        f, b, w = self.per_stage[action.stage]
        return {"F": f, "B": b, "W": w, "BW": b + w}[action.kind]

@dataclass(frozen=True)
class Slot:
    rank: int
    start: float
    end: float
    action: Action


@dataclass(frozen=True)
class Timeline:
    schedule: Schedule
    costs: Costs
    slots: tuple[Slot, ...]

    @property
    def ranks(self) -> int:
        return self.schedule.layout.ranks

    @property
    def makespan(self) -> float:
        return max(s.end for s in self.slots)

    def busy(self, rank: int) -> float:
        return sum(s.end - s.start for s in self.slots if s.rank == rank)

    def bubble(self, rank: int) -> float:
        """Idle time of ``rank`` between time 0 and the end of the whole step."""
        return self.makespan - self.busy(rank)

    @property
    def bubble_fraction(self) -> float:
        return sum(self.bubble(r) for r in range(self.ranks)) / (self.ranks * self.makespan)

    def peak_activations(self, rank: int) -> float:
        """Most micro-batch activations held at once, in units of one 1F1B stage's: held
        from a forward's start until the backward for inputs of that stage ends."""
        units = self.schedule.layout.stage_units
        events = []
        for slot in (s for s in self.slots if s.rank == rank):
            for action in slot.action.parts or (slot.action,):
                if action.kind == "F":
                    events.append((slot.start, 1))
                elif action.kind in ("B", "BW"):
                    events.append((slot.end, -1))
        held = peak = 0
        for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
            held += delta
            peak = max(peak, held)
        return peak * units


def simulate(schedule: Schedule, costs: Costs = Costs()) -> Timeline:
    layout = schedule.layout
    prev = layout.prev_stage
    finished: dict[tuple[str, int, int], float] = {}
    queues = [list(order) for order in schedule.orders]
    pending_w: list[list[Action]] = [[] for _ in range(layout.ranks)]
    free = [0.0] * layout.ranks
    slots: list[Slot] = []

    def ready_at(action: Action) -> float | None:
        needs: list[tuple[str, int, int]] = []
        for part in action.parts or (action,):
            k, m = part.stage, part.micro
            if part.kind == "F":
                before = prev[k]
                needs += [("F", before, m)] if before is not None else []
            elif part.kind in ("B", "BW"):
                nxt = layout.next_stage[k]
                needs += [("F", k, m), ("B", nxt, m) if nxt is not None else ("F", k, m)]
            elif part.kind == "W":
                needs.append(("B", k, m))
        if any(n not in finished for n in needs):
            return None
        rank = layout.stage_rank[(action.parts or (action,))[0].stage]
        return max((finished[n] + (costs.comm if layout.stage_rank[n[1]] != rank else 0.0)
                    for n in needs), default=0.0)

    def run(rank: int, action: Action, start: float) -> None:
        end = start + costs.duration(action, layout.stage_units)
        slots.append(Slot(rank, start, end, action))
        free[rank] = end
        for part in action.parts or (action,):
            if part.kind in ("F",):
                finished[("F", part.stage, part.micro)] = end
            if part.kind in ("B", "BW"):
                finished[("B", part.stage, part.micro)] = end
                if part.kind == "B" and layout.deferred_w:
                    pending_w[rank].append(Action("W", part.stage, part.micro))

    while any(queues) or any(pending_w):
        candidates = []
        for rank in range(layout.ranks):
            nxt = queues[rank][0] if queues[rank] else None
            ready = ready_at(nxt) if nxt is not None else None
            start = max(free[rank], ready) if ready is not None else None
            if pending_w[rank] and (nxt is None or start is None or start > free[rank]):
                candidates.append((free[rank], rank, "w"))  # fill the gap with a W
            elif start is not None:
                candidates.append((start, rank, "q"))
        if not candidates:
            stuck = {r: str(q[0]) for r, q in enumerate(queues) if q}
            raise RuntimeError(f"schedule {schedule.name} deadlocks: next actions {stuck}")
        start, rank, source = min(candidates)
        action = pending_w[rank].pop(0) if source == "w" else queues[rank].pop(0)
        run(rank, action, start)
    return Timeline(schedule, costs, tuple(sorted(slots, key=lambda s: (s.rank, s.start))))


@dataclass(frozen=True)
class ClosedForm:
    """A published bubble formula for a schedule: per-rank idle time, and its source."""

    bubble: float
    formula: str


def closed_form(name: str, ranks: int, micro: int, costs: Costs,
                chunks: int = CHUNKS) -> ClosedForm | None:
    """In this tool's notation: B is the backward for inputs alone, W the backward for
    weights, so a full backward is B+W. (DeepSeek-V3's table, where these come from, writes
    B for the full backward: its (PP-1)(F+B-2W) is (PP-1)(F+B-W) here.)"""
    f, b, w = costs.f, costs.b, costs.w
    fb = costs.of("FB")
    if name in ("gpipe", "1f1b"):
        return ClosedForm((ranks - 1) * (f + b + w), "(PP-1)(F+B+W)")
    if name == "interleaved":
        return ClosedForm((ranks - 1) * (f + b + w) / chunks, "(PP-1)(F+B+W)/v")
    if name == "zb":
        return ClosedForm((ranks - 1) * (f + b - w), "(PP-1)(F+B-W)")
    if name == "dualpipe":
        return ClosedForm((ranks / 2 - 1) * (fb + b - 2 * w), "(PP/2-1)(F&B+B-2W)")
    if name == "dualpipev":  # not published: DualPipe over 2*PP half-size stages
        return ClosedForm((ranks - 1) * (fb + b - 2 * w) / 2, "(PP-1)(F&B+B-2W)/2, derived")
    return None


def gpipe_bubble_fraction(ranks: int, micro: int) -> float:
    """GPipe's and 1F1B's bubble as a share of the step: (PP-1)/(M+PP-1)."""
    return (ranks - 1) / (micro + ranks - 1)


def run_schedule(name: str, ranks: int, micro: int, costs: Costs = Costs(),
                 chunks: int = CHUNKS) -> Timeline:
    return simulate(build(name, ranks, micro, chunks), costs)
