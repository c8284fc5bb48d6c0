"""Pipeline numbers for the terminal: simulated schedules, and what a real run measured.

The bubble a real run measured is the share of the step its ranks spent not computing:
1 - sum(busy) / (ranks x step time), per step, median over steps after the first.
The simulator is then run with the run's own mean forward, backward and weight times,
so both bubbles are for the same S, M and costs.
"""

from __future__ import annotations

import os
import statistics
from collections import defaultdict

from distdoctor.models import RunRecord
from distdoctor.pipeline.orders import CHUNKS
from distdoctor.pipeline.simulate import (
    Costs,
    Timeline,
    closed_form,
    gpipe_bubble_fraction,
    run_schedule,
)
from distdoctor.text import ranks_line

# which simulated schedule a real strategy runs (ZB-V has no simulator here)
SAME_TIME = 1e-9  # two simulated times closer than this are one
SIMULATED_AS = {"pipe-gpipe": "gpipe", "pipe-1f1b": "1f1b", "torch-pipe-gpipe": "gpipe",
                "torch-pipe-1f1b": "1f1b", "torch-pipe-interleaved": "interleaved",
                "torch-pipe-dualpipev": "dualpipev"}


def simulation_table(names: list[str], stages: int, micro: int, costs: Costs) -> str:
    header = (f"{'schedule':<12}{'makespan':>9}{'bubble':>9}{'closed':>9}  "
              f"{'bubble/rank sim':>16}{'closed form':>13}  {'formula':<24}"
              f"{'peak act':>9}{'params':>7}")
    rows = [f"PP={stages} M={micro} v={CHUNKS} F={costs.f:g} B={costs.b:g} W={costs.w:g} "
            f"F&B={costs.of('FB'):g} comm={costs.comm:g}",
            "(PP stages, M micro-batches, v chunks per rank when interleaved; F forward, B "
            "backward for inputs, W backward for weights, so a full backward is B+W; F&B an "
            "overlapped forward and full backward)",
            header, "-" * len(header)]
    notes = []
    for name in names:
        try:
            timeline = run_schedule(name, stages, micro, costs)
        except ValueError as exc:
            rows.append(f"{name:<12}  not defined here: {exc}")
            continue
        form = closed_form(name, stages, micro, costs)
        bubbles = [timeline.bubble(r) for r in range(stages)]
        fraction = (f"{gpipe_bubble_fraction(stages, micro):.2%}"
                    if name in ("gpipe", "1f1b") else "-")
        spread = (f"{bubbles[0]:.2f}" if max(bubbles) - min(bubbles) < SAME_TIME
                  else f"{min(bubbles):.2f}-{max(bubbles):.2f}")
        rows.append(
            f"{name:<12}{timeline.makespan:>9.2f}{timeline.bubble_fraction:>9.2%}{fraction:>9}  "
            f"{spread:>16}{(f'{form.bubble:.2f}' if form else '-'):>13}  "
            f"{(form.formula if form else 'none published'):<24}"
            f"{max(timeline.peak_activations(r) for r in range(stages)):>9g}"
            f"{timeline.schedule.layout.param_copies:>6}x")
        if form and abs(form.bubble - max(bubbles)) > SAME_TIME:
            notes.append(f"{name}: the closed form says {form.bubble:.2f} per rank, the "
                         f"simulated schedule idles {spread}: the formula's assumptions "
                         f"(uniform overlap) do not hold for these costs")
        notes += [f"{name}: {note}" for note in timeline.schedule.notes]
    rows.append("bubble: idle share of all ranks over the step; closed: (PP-1)/(M+PP-1) for "
                "GPipe and 1F1B; peak act: micro-batch activations held at once, in "
                "units of one 1F1B stage's; params: parameter copies")
    return "\n".join(rows + notes)


def measured_bubble(record: RunRecord) -> float | None:
    """Median over steps (after the first) of the idle share of all ranks in the step."""
    by_step = defaultdict(list)
    for rank in record.ranks:
        for event in rank.evidence.stage_events:
            by_step[event.step].append((rank.rank, event))
    shares = []
    for step, events in sorted(by_step.items())[1:] or sorted(by_step.items()):
        span = max(e.end for _, e in events) - min(e.start for _, e in events)
        busy = sum(e.end - e.start for _, e in events)
        if span > 0:
            shares.append(1 - busy / (len(record.ranks) * span))
    return statistics.median(shares) if shares else None


def measured_costs(record: RunRecord) -> Costs:
    """Each stage's mean forward, backward and weight times, and the latency of one hop
    between ranks, from the run (steps after the first). The uniform f, b, w are the
    means per rank-share of the model, for the table."""
    by_stage = defaultdict(list)
    for rank in record.ranks:
        for event in rank.evidence.stage_events:
            if event.step > 1:
                by_stage[(event.stage, event.kind)].append(event.end - event.start)
    stages = sorted({stage for stage, _ in by_stage})
    mean = {key: statistics.mean(values) for key, values in by_stage.items()}
    per_stage = tuple((mean.get((s, "F"), 0.0), mean.get((s, "B"), 0.0), mean.get((s, "W"), 0.0))
                      for s in stages)
    share = len(stages) / len(record.ranks)
    f, b, w = (statistics.mean(p[i] for p in per_stage) * share for i in range(3))
    return Costs(f, b, w, comm=hop_latency(record), per_stage=per_stage)


def hop_latency(record: RunRecord) -> float:
    """Median gap between a stage finishing a micro-batch and the next stage (on another
    rank) starting it, counted only when that rank sat idle waiting for it."""
    owner = {s.stage: r.rank for r in record.ranks for s in r.evidence.stages}
    events = {(e.step, e.kind, e.stage, e.micro): e
              for r in record.ranks for e in r.evidence.stage_events if e.step > 1}
    busy_until = {}  # (rank, event) -> when the rank's previous event ended
    for rank in record.ranks:
        ordered = sorted(rank.evidence.stage_events, key=lambda e: e.start)
        for before, event in zip(ordered, ordered[1:]):
            busy_until[id(event)] = before.end
    gaps = []
    for (step, kind, stage, micro), event in events.items():
        source = events.get((step, kind, stage - 1 if kind == "F" else stage + 1, micro))
        if source is None or owner.get(source.stage) == owner.get(stage):
            continue
        if busy_until.get(id(event), -1.0) <= source.end <= event.start:
            gaps.append(event.start - source.end)
    return statistics.median(gaps) if gaps else 0.0


def simulated_for(record: RunRecord) -> tuple[str, Timeline] | None:
    name = SIMULATED_AS.get(record.spec.strategy)
    if name is None:
        return None
    return name, run_schedule(name, record.spec.world_size, record.spec.micro_batches,
                              measured_costs(record))


def core_note(world_size: int) -> str:
    cores = os.cpu_count() or 1
    if world_size <= cores:
        return ""
    return (f"note: {world_size} ranks share {cores} cores here, so a rank's busy time "
            f"includes waiting for a core and the measured bubble reads low")


def pipeline_text(record: RunRecord, assessment) -> str:
    """Per stage: where it runs, its layers, parameters, FLOPs and CPU time; per step: loss,
    step time and distance from the single-process reference."""
    from distdoctor.analysis.timing import per_rank_times

    times = per_rank_times(record)
    rows = [f"{'stage':>5} {'rank':>4}  {'layers':<18}{'params':>8}{'MFLOP/micro':>13}"
            f"{'rank CPU ms/step':>18}"]
    for rank in record.ranks:
        for stage in rank.evidence.stages:
            layers = f"{stage.first_layer}-{stage.end_layer - 1} {stage.kinds}"
            cpu = times.get(rank.rank)
            rows.append(f"{stage.stage:>5} {rank.rank:>4}  {layers:<18}{stage.params:>8}"
                        f"{(stage.forward_flops + stage.backward_flops) / 1e6:>13.1f}"
                        f"{(f'{cpu * 1e3:.1f}' if cpu is not None else '-'):>18}")
    reference = assessment.reference.per_step if assessment.reference else ()
    rows.append(f"{'step':>5} {'loss':>10} {'step ms':>9} {'vs 1-proc':>10}")
    steps = max((r.evidence.pipe_steps for r in record.ranks), key=len, default=())
    for index, step in enumerate(steps):
        loss = next((s.loss for r in record.ranks for s in r.evidence.pipe_steps
                     if s.step == step.step and s.loss is not None), None)
        span = max(s.end for r in record.ranks for s in r.evidence.pipe_steps
                   if s.step == step.step) - min(s.start for r in record.ranks
                                                 for s in r.evidence.pipe_steps
                                                 if s.step == step.step)
        diff = reference[index] if index < len(reference) else None
        rows.append(f"{step.step:>5} {(f'{loss:.6f}' if loss is not None else '-'):>10} "
                    f"{span * 1e3:>9.1f} {(f'{diff:.2e}' if diff is not None else '-'):>10}")
    if not record.finished:
        rows.append("ranks: " + ranks_line(record))
    return "\n".join(rows)
