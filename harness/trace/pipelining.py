"""What a user's pipeline shows through ``torch.distributed.pipelining``: each stage's
compute per micro-batch, the evidence for a stage that gates every cycle
(checks/unbalanced_stages.py).

Once torch's pipelining stage module is imported (by whoever: trace/afterimport.py), the
stage class's forward, backward and weight backward of one micro-batch are timed: the
calling thread's CPU time (what other processes sharing the core do not add to; on CPU,
autograd runs a backward on the calling thread) and the monotonic clock, tagged with
the optimiser step they fall in (``tracer.optimizer_steps``: the events before the first
``optimizer.step()`` are step 1). The receives a schedule waits for happen outside these
methods, so a stage's time is its own compute. Each stage's parameters and top-level
layers are counted at its first call.

Transparency: the methods are replaced on torch's class, never on an object the user
holds; each returns what torch's returns and raises what it raises.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections import Counter
from typing import Any, Callable

from distdoctor.models.events import Ev
from distdoctor.trace.afterimport import after_import
from distdoctor.trace.tracer import incomplete

MODULE = "torch.distributed.pipelining.stage"
WHAT = "pipeline stage times"  # the evidence, as a cut-short report names it
# the stage's methods that compute one micro-batch, and the action each is (StageEvent)
TIMED = {"forward_one_chunk": "F", "backward_one_chunk": "B",
         "backward_weight_one_chunk": "W"}


def record_pipeline_stages(tracer: Any) -> None:
    # the stages whose layers were written: by object, not index, since a warm pool's next
    # job builds its own stages with the same indices
    counted: weakref.WeakSet = weakref.WeakSet()

    def wrap(module) -> None:
        base = module._PipelineStageBase
        for name, kind in TIMED.items():
            original = base.__dict__.get(name)
            if original is not None and not getattr(original, "_distdoctor", False):
                setattr(base, name, _timed(tracer, original, kind, counted))

    after_import(MODULE, wrap, WHAT)


def _timed(tracer: Any, original: Callable, kind: str, counted: weakref.WeakSet) -> Callable:
    @functools.wraps(original)
    def timed(self, *args, **kwargs):
        start, cpu = time.monotonic(), time.thread_time()
        try:
            return original(self, *args, **kwargs)
        finally:
            try:
                chunk = args[0] if args else kwargs.get("fwd_chunk_id",
                                                        kwargs.get("bwd_chunk_id", -1))
                _write(tracer, self, chunk, kind, start, cpu, counted)
            except Exception as exc:  # noqa: BLE001 (reported as incomplete evidence)
                incomplete(WHAT, exc)

    timed._distdoctor = True  # type: ignore[attr-defined]
    return timed


def _write(tracer: Any, stage, chunk, kind: str, start: float, cpu: float,
           counted: weakref.WeakSet) -> None:
    cpu = time.thread_time() - cpu
    index = int(stage.stage_index)
    if stage not in counted:
        counted.add(stage)
        layers = Counter(type(m).__name__ for m in stage.submod.children())
        tracer.write(ev=Ev.STAGE_HELD, stage=index,
                     params=sum(p.numel() for p in stage.submod.parameters()),
                     layers=sum(layers.values()),
                     kinds=", ".join(f"{n} {name}" for name, n in layers.items()))
    tracer.write(ev=Ev.STAGE_CALL, step=tracer.optimizer_steps + 1, stage=index,
                 micro=int(chunk), kind=kind, t0=start, t1=time.monotonic(), cpu=cpu)
