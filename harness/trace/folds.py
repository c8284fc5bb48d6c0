"""Each recorder's events read back into evidence: what ``analyze`` and the parent need
of a rank's trace. Apart from the recorders (which import torch, numpy and patch them), so
that reading traces costs no torch import: ``distdoctor analyze`` starts in a fraction of
the 1.4 s torch takes."""

from __future__ import annotations

import math
import sys
from array import array
from typing import Iterable

from distdoctor.models import (
    Arrival,
    BatchEvidence,
    BufferEvidence,
    Call,
    ClearedGradients,
    DDPForward,
    Fingerprint,
    GapSample,
    GradientEvidence,
    GroupTensor,
    MemoryEvidence,
    NonFiniteEvidence,
    OptimizerEvidence,
    Phase,
    SkippedStep,
    StageCost,
    StageEvent,
)
from distdoctor.models.events import Ev


def fold_group_tensors(events: Iterable[dict]) -> tuple[GroupTensor, ...]:
    found = []
    for e in events:
        if e.get("ev") != Ev.TP_TENSOR:
            continue
        values = tuple(e["values"])
        found.append(GroupTensor(
            e["step"], e["name"], e["kind"], e.get("alike", True) is not False,
            tuple(e["group"]),
            Fingerprint(e["numel"], repr(values), math.sqrt(sum(v * v for v in values)),
                        values), e.get("where", "")))
    return tuple(found)

def fold_optimizer(events: Iterable[dict]) -> tuple[OptimizerEvidence, ...]:
    found = []
    for e in events:
        if e.get("ev") != Ev.OPTIMIZER:
            continue
        found.append(OptimizerEvidence(
            e["step"], e["optimizer"], e["params"], e["numel"],
            tuple(tuple((k, v) for k, v in group) for group in e["settings"]),
            tuple((name, _values(text)) for name, text in e.get("state", {}).items()),
            _values(e.get("sampled", "")), e.get("where", ""), e.get("scheduled", ""),
            e.get("clipped", ""), e.get("loaded", ""), e.get("built", "")))
    return tuple(found)

def _values(text: str) -> tuple[float, ...]:
    values = array("d", bytes.fromhex(text))
    if sys.byteorder == "big":
        values.byteswap()
    return tuple(values)

def fold_memory(events: Iterable[dict]) -> tuple[MemoryEvidence, ...]:
    """A user's rank's training state as trace/memory.py measured it (read, never trusted:
    an event missing a count or holding a negative one is left out)."""
    found = []
    for e in events:
        if e.get("ev") != Ev.MEMORY_HELD:
            continue
        said = [e.get(k) for k in ("step", "stage", "world_size", "params", "grads",
                                   "optimizer", "budget", "model_params", "largest",
                                   "tensors", "stepped")]
        counts = [c for c in said if isinstance(c, int) and not isinstance(c, bool) and c >= 0]
        if len(counts) != len(said):
            continue
        step, stage, world, params, grads, optimizer, budget, model, largest, tensors, \
            stepped = counts
        found.append(MemoryEvidence(
            step=step, stage=stage, world_size=world, params=params, grads=grads,
            optimizer=optimizer, gathered=0, budget=budget, model_params=model,
            largest_layer=largest, layers=tensors, optimizer_tensors=stepped))
    return tuple(found)


def fold_nonfinite(events: Iterable[dict]) -> tuple[NonFiniteEvidence, ...]:
    return tuple(NonFiniteEvidence(
        step=e["step"], loss=None if e.get("loss") is None else float(e["loss"]),
        loss_where=e.get("loss_where", ""), local=tuple(e.get("local", ())),
        where=e.get("where", ""))
        for e in events if e.get("ev") == Ev.NONFINITE)

def fold_buffers(events: Iterable[dict]) -> tuple[BufferEvidence, ...]:
    return tuple(BufferEvidence(e["step"], tuple(e["names"]),
                                tuple(tuple(v) for v in e["values"]), e.get("where", ""))
                 for e in events if e.get("ev") == Ev.BUFFERS)

def fold_gradients(events: Iterable[dict]) -> tuple[GradientEvidence, ...]:
    """Each sampled optimiser step's local and applied gradients and parameters; between
    the steps whose gradients were sampled, the parameters alone."""
    def print_of(values: list[float], numel: int) -> Fingerprint:
        return Fingerprint(numel, repr(values), math.sqrt(sum(v * v for v in values)),
                           tuple(values))

    found, line = [], ""
    for e in events:
        if e.get("ev") == Ev.PARAMS:
            found.append(GradientEvidence(e["step"], None, None,
                                          print_of(_rows(e["rows"], 1)[0], e["numel"]),
                                          e.get("where", line), e.get("t")))
            continue
        if e.get("ev") != Ev.GRADS:
            continue
        line = e.get("where", "")
        params: list[float] | None
        if "rows" in e:
            local, applied, params = _rows(e["rows"])
        else:  # written before the rows were packed
            local, applied, params = e["local"], e["applied"], e.get("params")
        scale = e.get("scale")  # a GradScaler's: the local samples are of loss * scale
        if isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0:
            local = [v / scale for v in local]
        found.append(GradientEvidence(
            e["step"], print_of(local, e["numel"]), print_of(applied, e["numel"]),
            None if params is None else print_of(params, e["numel"]), e.get("where", ""),
            e.get("t"), tuple(e.get("gst", ())), tuple(e.get("pst", ()))))
    return tuple(found)

def _rows(text: str, count: int = 3) -> list[list[float]]:
    """``count`` sample rows (local, applied, params; or params alone) from their
    little-endian float64 hex."""
    values = array("d", bytes.fromhex(text))
    if sys.byteorder == "big":
        values.byteswap()
    width = len(values) // count
    return [values[i * width:(i + 1) * width].tolist() for i in range(count)]

def fold_batches(events: Iterable[dict]) -> tuple[BatchEvidence, ...]:
    """Each loader batch the rank drew; a pass ``trains`` when an optimiser stepped between
    its first batch and its end (or the loader's next pass)."""
    events = list(events)
    drawn = [e for e in events if e.get("ev") == Ev.BATCH]
    ends = {(e["loader"], e["epoch"]): e["steps"] for e in events if e.get("ev") == Ev.PASS_END}
    first: dict[tuple[int, int], int] = {}
    last: dict[tuple[int, int], int] = {}
    for e in drawn:
        first.setdefault((e["loader"], e["epoch"]), e["steps"])
        last[e["loader"], e["epoch"]] = e["steps"]
    trains = {}
    for (loader, epoch), began in first.items():
        later = ends.get((loader, epoch), first.get((loader, epoch + 1), began))
        trains[loader, epoch] = max(later, last[loader, epoch]) > began
    return tuple(BatchEvidence(
        loader=e["loader"], epoch=e["epoch"], sample_ids=tuple(e["ids"]), sampler=e["sampler"],
        sampler_epoch=e.get("sampler_epoch"), where=e.get("where", ""),
        trains=trains[e["loader"], e["epoch"]], data=str(e.get("data", "")),
        shuffles=e.get("shuffles") if isinstance(e.get("shuffles"), bool) else None)
        for e in drawn)

def fold_ddp_forwards(events: Iterable[dict]) -> tuple[DDPForward, ...]:
    return tuple(DDPForward(e["steps"], e["sync"], e["bytes"], e.get("where", ""), e.get("t"),
                            e["version"] if isinstance(e.get("version"), int) else None)
                 for e in events if e.get("ev") == Ev.DDP_FORWARD)

def fold_skipped(events: Iterable[dict]) -> tuple[SkippedStep, ...]:
    return tuple(SkippedStep(int(e["steps"]), _time(e["t"]))
                 for e in events if e.get("ev") == Ev.STEP_SKIPPED)

def fold_cleared(events: Iterable[dict]) -> tuple[ClearedGradients, ...]:
    return tuple(ClearedGradients(int(e["steps"]), _time(e["t"]), str(e.get("where", "")))
                 for e in events if e.get("ev") == Ev.GRADS_CLEARED)


def fold_phases(events: Iterable[dict]) -> tuple[Phase, ...]:
    return tuple(Phase(str(e["k"]), _time(e["t0"]), _time(e["t1"]), int(e["s"]),
                       str(e.get("where", "")), _clock(e))
                 for e in events if e.get("ev") == Ev.PHASE)


def _clock(event: dict) -> tuple[float, float] | None:
    """A phase's thread CPU clock (ran, waited), when both are written and readable."""
    ran, waited = _seconds(event.get("cr")), _seconds(event.get("cw"))
    return (ran, waited) if ran is not None and waited is not None else None

def _time(value: object) -> float:
    """A time from a trace: a finite number (ValueError, so the line reads as unreadable,
    for anything else: traces come from elsewhere)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise ValueError(f"not a time: {value!r}")
    return float(value)

def fold_stages(events: Iterable[dict]) -> tuple[tuple[StageCost, ...],
                                                 tuple[StageEvent, ...]]:
    """A user's pipeline stages (trace/pipelining.py): each stage's parameters and layers,
    and each forward or backward of a micro-batch. A stage's layers are numbered within
    its own module, and no FLOPs are counted (0)."""
    held, calls = [], []
    for e in events:
        if e.get("ev") == Ev.STAGE_HELD:
            held.append(StageCost(int(e["stage"]), 0, int(e["layers"]), str(e["kinds"]),
                                  int(e["params"]), 0, 0))
        elif e.get("ev") == Ev.STAGE_CALL:
            calls.append(StageEvent(int(e["step"]), int(e["stage"]), int(e["micro"]),
                                    str(e["kind"]), _time(e["t0"]), _time(e["t1"]),
                                    _time(e["cpu"])))
    return tuple(held), tuple(calls)


def fold_gap_samples(events: Iterable[dict]) -> tuple[GapSample, ...]:
    return tuple(GapSample(int(e["s"]), str(line[0]), str(line[1]),
                           int(line[2]) * _time(e["period"]),
                           str(line[3]) if len(line) > 3 else "")
                 for e in events if e.get("ev") == Ev.GAP_SAMPLES for line in e["lines"])

def fold_arrivals(events: Iterable[dict]) -> tuple[tuple[Arrival, ...], float | None,
                                                  tuple[float, float] | None]:
    """The collectives a rank entered, by its Flight Recorder (the last such event: a
    pool's rank writes one per job), its wall-clock offset, and the seconds its threads
    ran on a CPU and waited for one over the job (None: not read)."""
    last = None
    for e in events:
        if e.get("ev") == Ev.ARRIVALS:
            last = e
    if last is None:
        return (), None, None
    ran, waited = _seconds(last.get("cpu_ran")), _seconds(last.get("cpu_wait"))
    cpu = (ran, waited) if ran is not None and waited is not None else None
    groups = {str(name): tuple(int(r) for r in ranks) for name, ranks in last["groups"].items()}
    default = last.get("default")
    return tuple(Arrival(None if name == default else name, groups[name], int(seq), str(op),
                         _time(at))
                 for name, seq, op, at in last["calls"] if name in groups), \
        _time(last["offset"]), cpu

def _seconds(value: object) -> float | None:
    """A duration as written (read, never trusted: a number, not negative), else None."""
    return float(value) if isinstance(value, (int, float)) and \
        not isinstance(value, bool) and value >= 0 else None


def fold(events: Iterable[dict]) -> tuple[Call, ...]:
    """Turn a rank's JSON events into one Call per call, in the order they were entered."""
    calls: dict[int, dict] = {}
    for event in events:
        kind = event.get("ev")
        if kind == Ev.ENTER:
            calls[event["id"]] = {k: v for k, v in event.items() if k not in ("ev", "t")}
            calls[event["id"]]["entered"] = event["t"]
        elif event.get("id") in calls:
            call = calls[event["id"]]
            if kind == Ev.WAIT:
                call.setdefault("waited", event["t"])
                call.setdefault("wait_where", event.get("where", ""))
            elif kind == Ev.DONE:
                call["completed"] = event["t"]
            elif kind == Ev.ERROR:
                call["error"] = event.get("error")
            elif kind == Ev.FUTURE:
                call["future"] = True
    return tuple(Call(
        id=c["id"], rank=c.get("rank", -1), op=c["op"], seq=c["seq"], group=tuple(c["group"]),
        peer=c.get("peer"), peers=tuple((e[0], e[1]) for e in c.get("peers", [])),
        shapes=tuple(tuple(s) for s in c["shapes"]), dtype=c["dtype"],
        reduce_op=c.get("reduce_op"), where=c.get("where", ""), async_op=c["async_op"],
        entered=c["entered"], waited=c.get("waited"), wait_where=c.get("wait_where", ""),
        completed=c.get("completed"), error=c.get("error"), pg=c.get("pg"), tag=c.get("tag", 0),
        storages=tuple(c.get("st", ())), step=c.get("s"), future=c.get("future", False))
        for c in calls.values())
