"""Rebuild one rank's Evidence from the records it streamed home, however far it got."""

from __future__ import annotations

from distdoctor.models import Evidence
from distdoctor.trace.batches import fold_batches
from distdoctor.trace.gradients import fold_gradients
from distdoctor.trace.nonfinite import fold_nonfinite
from distdoctor.trace.tensorparallel import fold_group_tensors
from distdoctor.trace.tracer import fold, fold_ddp_forwards

# event kind -> Evidence field, for records that accumulate
_SERIES = {"backward": "backward", "step": "steps", "stage": "stages",
           "stage_event": "stage_events", "pipe_step": "pipe_steps",
           "memory": "memory", "group_tensor": "group_tensors", "traffic": "traffic"}
# event kind -> Evidence field, for records that happen once
_ONCE = {"built": "built_params", "initial": "initial_params", "holds": "holds",
         "node": "node"}


def evidence_from_events(rank: int, events: tuple, trace: tuple = ()) -> Evidence:
    """``events`` as the rank emitted them; ``trace`` its tracer's JSON events."""
    fields: dict = {name: [] for name in _SERIES.values()}
    fields["calls"] = list(fold(trace))
    fields["batches"] = list(fold_batches(trace))
    fields["gradients"] = list(fold_gradients(trace))
    fields["ddp_forwards"] = list(fold_ddp_forwards(trace))
    fields["nonfinite"] = list(fold_nonfinite(trace))
    fields["group_tensors"] = list(fold_group_tensors(trace))
    ddp = [event for event in trace if event.get("ev") == "ddp"]
    if ddp:
        fields["ddp_params"] = tuple(ddp[-1]["params"])
        fields["ddp_group"] = tuple(ddp[-1].get("group", ()))
    for kind, payload in events:
        if kind in _SERIES:
            fields[_SERIES[kind]].append(payload)
        elif kind in _ONCE:
            fields.setdefault(_ONCE[kind], payload)
    return Evidence(rank=rank, **{k: tuple(v) if isinstance(v, list) else v
                                  for k, v in fields.items()})
