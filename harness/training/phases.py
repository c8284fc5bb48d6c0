"""Where the built-in workload's step time goes, recorded as a user's rank records it
(``models.evidence.Phase``): the straggler check reads these to say which part of a late
rank's step runs long, and the optimiser phase's thread CPU clock to tell a rank that did
more work from one whose core ran other work (the machine's, not the program's). Every
training loop of the workload records them, the tensor-parallel one too: a healthy
tensor-parallel run under a busy loop on every core was once called a straggler for want
of that clock."""

from __future__ import annotations

import time

from distdoctor.launch.rank import RankContext
from distdoctor.models import Phase
from distdoctor.models.events import Emit
from distdoctor.trace.cpuwait import thread_cpu_seconds


def record_phase(ctx: RankContext, kind: str, step: int, began: float) -> None:
    """Phase ``kind`` of (1-based) ``step`` from ``began`` (time.monotonic) to now; the
    optimiser's phase carries the main thread's CPU clock."""
    cpu = thread_cpu_seconds() if kind == "optimizer" else None
    ctx.emit((Emit.PHASE, Phase(kind, began, time.monotonic(), step - 1, cpu=cpu)))
