"""What a job leaves in its trace once it is over: the samples of its last step
(trace/phases.py) and when it entered each collective (trace/arrivals.py). Written once
per job: as the script ends, or as it destroys its default process group, which takes the
recorder's groups with it."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from distdoctor.trace.arrivals import write_arrivals
from distdoctor.trace.phases import flush_samples
from distdoctor.trace.tracer import incomplete


def job_ended(tracer: Any) -> None:
    if tracer.ended:
        return
    tracer.ended = True
    flush_samples(tracer)
    write_arrivals(tracer, tracer.started)


def before_teardown(tracer: Any) -> None:
    """End the job in the trace as the script destroys its default group, before it goes."""
    original = c10d.destroy_process_group
    if hasattr(original, "__wrapped__"):
        return

    def destroy(group: Any = None) -> None:
        if group is None:
            try:
                job_ended(tracer)
            # Reported as incomplete evidence, below; evidence is best effort.
            except Exception as exc:  # noqa: BLE001
                incomplete("when each rank entered its collectives", exc)
        original(group)

    setattr(destroy, "__wrapped__", original)  # noqa: B010 (as functools.wraps sets it)
    setattr(c10d, "destroy_process_group", destroy)  # noqa: B010 (a patch)
    setattr(dist, "destroy_process_group", destroy)  # noqa: B010
