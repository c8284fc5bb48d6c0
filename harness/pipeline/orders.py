"""Pipeline schedules as per-rank action lists, and the stage layout they run on.

An action is a forward (F), a backward for inputs (B), a backward for weights (W), a full
backward (BW = B then W), or an overlapped forward+backward pair (FB, DualPipe's F&B) on one
stage for one micro-batch. A layout says which rank holds each stage and which stage feeds
which, so a simulator (or a real run) can work out every dependency.

GPipe and 1F1B follow torch's order; interleaved 1F1B follows Megatron's; ZB-H1 is 1F1B with
backward split and each W deferred until the rank would otherwise wait (Qi et al., "Zero
Bubble Pipeline Parallelism"); DualPipe and DualPipeV follow the eight-step structure of
DeepSeek's DualPipe, which torch's ScheduleDualPipeV also uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["F", "B", "W", "BW", "FB"]
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb", "dualpipe", "dualpipev")

CHUNKS = 2  # model chunks per rank in the interleaved schedule (v)


@dataclass(frozen=True)
class Action:
    kind: Kind
    stage: int
    micro: int
    parts: tuple[Action, ...] = ()  # FB: the forward and the full backward it overlaps

    def __str__(self) -> str:
        if self.kind == "FB":
            return "+".join(map(str, self.parts))
        return f"{self.kind}{self.micro}@s{self.stage}"


@dataclass(frozen=True)
class Layout:
    """Which rank holds each stage, and the stage each one feeds (None at the ends)."""

    ranks: int
    stage_rank: tuple[int, ...]
    next_stage: tuple[int | None, ...]
    stage_units: float = 1.0  # a stage's activations, in units of one 1F1B stage's
    param_copies: int = 1
    deferred_w: bool = False  # W actions are filled in by the simulator (ZB-H1)
    micro_per_stage: int = 0  # micro-batches through each stage

    @property
    def prev_stage(self) -> tuple[int | None, ...]:
        prev: list[int | None] = [None] * len(self.stage_rank)
        for stage, nxt in enumerate(self.next_stage):
            if nxt is not None:
                prev[nxt] = stage
        return tuple(prev)


@dataclass(frozen=True)
class Schedule:
    name: str
    layout: Layout
    orders: tuple[tuple[Action, ...], ...]  # per rank, in execution order
    notes: tuple[str, ...] = field(default=())


def chain(ranks: int, stages_per_rank: int = 1) -> Layout:
    """Stages 0..S-1 in a line; stage k on rank k % ranks (looped for interleaving)."""
    total = ranks * stages_per_rank
    return Layout(ranks, tuple(k % ranks for k in range(total)),
                  tuple(k + 1 if k + 1 < total else None for k in range(total)),
                  stage_units=1 / stages_per_rank)


def build(name: str, ranks: int, micro: int, chunks: int = CHUNKS) -> Schedule:
    """The action lists of schedule ``name`` for ``ranks`` ranks and ``micro`` micro-batches."""
    builders = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved, "zb": zb_h1,
                "dualpipe": dualpipe, "dualpipev": dualpipev}
    if name not in builders:
        raise ValueError(f"unknown schedule {name!r}; choose from {', '.join(SCHEDULES)}")
    if ranks < 1 or micro < 1:
        raise ValueError("stages and micro-batches must be at least 1")
    if name == "interleaved":
        return interleaved(ranks, micro, chunks)
    return builders[name](ranks, micro)


def gpipe(ranks: int, micro: int) -> Schedule:
    orders = tuple(tuple([Action("F", s, m) for m in range(micro)]
                         + [Action("BW", s, m) for m in range(micro)]) for s in range(ranks))
    return Schedule("gpipe", _with_micro(chain(ranks), micro), orders)


def one_f_one_b(ranks: int, micro: int) -> Schedule:
    orders = []
    for s in range(ranks):
        warmup = min(ranks - s - 1, micro)
        order = [Action("F", s, m) for m in range(warmup)]
        for i in range(micro - warmup):
            order += [Action("F", s, warmup + i), Action("BW", s, i)]
        order += [Action("BW", s, m) for m in range(micro - warmup, micro)]
        orders.append(tuple(order))
    return Schedule("1f1b", _with_micro(chain(ranks), micro), tuple(orders))


def zb_h1(ranks: int, micro: int) -> Schedule:
    """1F1B's F/B order with backward split; the simulator slots each W into idle time."""
    base = one_f_one_b(ranks, micro)
    orders = tuple(tuple(Action("B", a.stage, a.micro) if a.kind == "BW" else a for a in order)
                   for order in base.orders)
    layout = _with_micro(chain(ranks), micro)
    return Schedule("zb", Layout(**{**layout.__dict__, "deferred_w": True}), orders,
                    ("W passes are placed by the simulator: each rank runs a pending W "
                     "whenever its next F or B is not ready, and the rest at the end",))


def interleaved(ranks: int, micro: int, chunks: int = CHUNKS) -> Schedule:
    """Megatron's interleaved 1F1B: each rank holds ``chunks`` stages of a looped chain."""
    if micro % ranks:
        raise ValueError(f"interleaved 1F1B needs micro-batches divisible by stages "
                         f"({micro} % {ranks} != 0)")
    total = micro * chunks

    def forward_of(k: int) -> tuple[int, int]:  # (chunk, micro) of a rank's k-th forward
        return (k // ranks) % chunks, (k // (ranks * chunks)) * ranks + k % ranks

    def backward_of(k: int) -> tuple[int, int]:
        chunk, m = forward_of(k)
        return chunks - 1 - chunk, m

    orders = []
    for r in range(ranks):
        warmup = min((ranks - r - 1) * 2 + (chunks - 1) * ranks, total)
        order = []
        for k in range(warmup):
            c, m = forward_of(k)
            order.append(Action("F", c * ranks + r, m))
        for i in range(total - warmup):
            c, m = forward_of(warmup + i)
            order.append(Action("F", c * ranks + r, m))
            c, m = backward_of(i)
            order.append(Action("BW", c * ranks + r, m))
        for i in range(total - warmup, total):
            c, m = backward_of(i)
            order.append(Action("BW", c * ranks + r, m))
        orders.append(tuple(order))
    return Schedule("interleaved", _with_micro(chain(ranks, chunks), micro), tuple(orders))


def dualpipe(ranks: int, micro: int) -> Schedule:
    """Two directions, each over every rank: rank r holds stage r of direction 0 and stage
    N-1-r of direction 1 (hence two parameter copies); M/2 micro-batches per direction."""
    if ranks % 2 or micro % 2 or micro < 2 * ranks:
        raise ValueError(f"DualPipe needs an even number of stages and an even number of "
                         f"micro-batches, at least twice the stages (got {ranks}, {micro})")
    # stage ids: direction 0 stage k -> k; direction 1 stage k -> ranks + k
    stage_rank = tuple(list(range(ranks)) + [ranks - 1 - k for k in range(ranks)])
    next_stage = tuple([k + 1 if k + 1 < ranks else None for k in range(ranks)]
                       + [ranks + k + 1 if k + 1 < ranks else None for k in range(ranks)])
    layout = Layout(ranks, stage_rank, next_stage, 1.0, 2, micro_per_stage=micro // 2)
    orders = []
    for r in range(ranks):
        half = ranks // 2
        phase_stage = (r, ranks + ranks - 1 - r)  # (direction 0 stage, direction 1 stage)
        if r >= half:  # for the second half of the ranks phase 0 is the reverse direction
            phase_stage = phase_stage[::-1]
        orders.append(_eight_steps(phase_stage, half, min(r, ranks - 1 - r), micro // 2))
    return Schedule("dualpipe", layout, tuple(orders))


def dualpipev(ranks: int, micro: int) -> Schedule:
    """One direction folded into a V: rank r holds stages r and 2N-1-r (one copy)."""
    if micro < 2 * ranks:
        raise ValueError(f"DualPipeV needs at least twice as many micro-batches as stages "
                         f"(got {micro} for {ranks})")
    total = 2 * ranks
    layout = Layout(ranks, tuple(k if k < ranks else total - 1 - k for k in range(total)),
                    tuple(k + 1 if k + 1 < total else None for k in range(total)),
                    0.5, 1, micro_per_stage=micro)
    orders = tuple(_eight_steps((r, total - 1 - r), ranks, r, micro) for r in range(ranks))
    return Schedule("dualpipev", layout, orders)


def _eight_steps(phase_stage: tuple[int, int], half: int, h: int, per_phase: int) -> tuple:
    """DualPipe's eight steps for one rank: its two phases' stages, the number of ranks per
    direction-half, its position from the nearer end, and micro-batches per phase."""
    counts: dict[tuple[str, int], int] = {}
    weights: list[Action] = []
    order: list[Action] = []

    def take(kind: Kind, phase: int) -> Action:
        stage = phase_stage[phase]
        key = ("F" if kind == "F" else "B", stage)
        counts[key] = counts.get(key, 0) + 1
        return Action(kind, stage, counts[key] - 1)

    def forward(phase):
        order.append(take("F", phase))

    def backward(phase, split=False):
        action = take("B" if split else "BW", phase)
        order.append(action)
        if split:
            weights.append(Action("W", action.stage, action.micro))

    def weight():
        if weights:
            order.append(weights.pop(0))

    def overlapped(f_phase, b_phase):
        order.append(Action("FB", -1, -1, (take("F", f_phase), take("BW", b_phase))))

    for _ in range((half - h - 1) * 2):  # 1: nF0
        forward(0)
    for _ in range(h + 1):  # 2: nF0F1
        forward(0)
        forward(1)
    for _ in range(half - h - 1):  # 3: nB1W1F1
        backward(1, split=True)
        weight()
        forward(1)
    for i in range(per_phase - 2 * half + h + 1):  # 4: nF0B1F1B0, overlapped pairs
        if i == 0 and h == half - 1:  # the middle ranks do not overlap their first pair
            forward(0)
            backward(1)
        else:
            overlapped(0, 1)
        overlapped(1, 0)
    for _ in range(half - h - 1):  # 5: nB1F1B0
        backward(1)
        overlapped(1, 0)
    split = False
    for i in range(h + 1):  # 6: nB1B0, the second half with zero bubble
        if i == (h + 1) // 2 and h % 2 == 1:
            split = True
        backward(1, split)
        if i == (h + 1) // 2 and h % 2 == 0:
            split = True
        backward(0, split)
    for _ in range(half - h - 1):  # 7: nWB0
        weight()
        backward(0, split=True)
    while weights:  # 8: nW
        weight()
    return tuple(order)


def _with_micro(layout: Layout, micro: int) -> Layout:
    return Layout(**{**layout.__dict__, "micro_per_stage": micro})
