"""Rebuild one rank's Evidence from the records it streamed home, however far it got."""

from __future__ import annotations

from typing import Any

from distdoctor.models import Evidence, Incomplete
from distdoctor.models.events import EMITTED, Emit, Ev, unknown_kinds
from distdoctor.trace.folds import (
    fold,
    fold_arrivals,
    fold_batches,
    fold_buffers,
    fold_cleared,
    fold_ddp_forwards,
    fold_gap_samples,
    fold_gradients,
    fold_group_tensors,
    fold_memory,
    fold_nonfinite,
    fold_optimizer,
    fold_phases,
    fold_skipped,
    fold_stages,
)
from distdoctor.trace.startup import fold_startup

# record tag -> Evidence field, for records that accumulate
_SERIES = {Emit.BACKWARD: "backward", Emit.STEP: "steps", Emit.STAGE: "stages",
           Emit.STAGE_EVENT: "stage_events", Emit.PIPE_STEP: "pipe_steps",
           Emit.MEMORY: "memory", Emit.PHASE: "phases", Emit.GROUP_TENSOR: "group_tensors",
           Emit.TRAFFIC: "traffic", Emit.RESTART: "restarts"}
# record tag -> Evidence field, for records that happen once
_ONCE = {Emit.BUILT: "built_params", Emit.INITIAL: "initial_params", Emit.HOLDS: "holds",
         Emit.NODE: "node"}


def evidence_from_events(rank: int, events: tuple, trace: tuple = ()) -> Evidence:
    """``events`` as the rank emitted them; ``trace`` its tracer's JSON events."""
    fields: dict[str, Any] = {name: [] for name in _SERIES.values()}
    fields["calls"] = list(fold(trace))
    fields["batches"] = list(fold_batches(trace))
    fields["gradients"] = list(fold_gradients(trace))
    fields["ddp_forwards"] = list(fold_ddp_forwards(trace))
    fields["skipped"] = list(fold_skipped(trace))
    fields["cleared"] = list(fold_cleared(trace))
    fields["buffers"] = list(fold_buffers(trace))
    fields["nonfinite"] = list(fold_nonfinite(trace))
    fields["optimizer"] = list(fold_optimizer(trace))
    fields["group_tensors"] = list(fold_group_tensors(trace))
    fields["incomplete"] = list(fold_incomplete(trace))
    fields["phases"] = list(fold_phases(trace))
    fields["gap_samples"] = list(fold_gap_samples(trace))
    fields["arrivals"], fields["wall_offset"], fields["cpu_s"] = fold_arrivals(trace)
    fields["startup"] = fold_startup(trace)
    fields["dropouts"] = tuple(dict.fromkeys(
        e["name"] for e in trace if e.get("ev") == Ev.DROPOUT and isinstance(e.get("name"), str)))
    ddp = [event for event in trace if event.get("ev") == Ev.DDP]
    if ddp:
        fields["ddp_params"] = tuple(ddp[-1]["params"])
        fields["ddp_group"] = tuple(ddp[-1].get("group", ()))
    for kind, payload in events:
        if kind in _SERIES:
            fields[_SERIES[kind]].append(payload)
        elif kind in _ONCE:
            fields.setdefault(_ONCE[kind], payload)
        elif kind not in EMITTED:  # our own rank job wrote it: a reader is missing
            raise ValueError(f"rank {rank} recorded {kind!r}, a kind no reader knows "
                             f"(distdoctor.models.events.Emit)")
    if not fields["memory"]:  # a user's rank under a budget (the built-in emits its own)
        fields["memory"] = list(fold_memory(trace))
    if not fields["stage_events"]:  # a user's pipeline (the built-in one emits its own)
        held, calls = fold_stages(trace)
        fields["stages"], fields["stage_events"] = list(held), list(calls)
    built: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                             for k, v in fields.items()}
    return Evidence(rank=rank, **built)


def fold_incomplete(trace: tuple) -> tuple[Incomplete, ...]:
    """The evidence a rank's recorders reported cut short, and trace events of kinds this
    version cannot read (a trace written by another version): neither passes in silence."""
    found = [Incomplete(e.get("what", "?"), e.get("step"), e.get("error", ""))
             for e in trace if e.get("ev") == Ev.INCOMPLETE]
    found += [Incomplete(f"{count} trace event{'s' * (count > 1)} of unknown kind {kind!r}",
                         None, "written by another version of distdoctor?")
              for kind, count in sorted(unknown_kinds(trace).items())]
    return tuple(found)
