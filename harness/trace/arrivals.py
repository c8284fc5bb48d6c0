"""When this rank entered each collective, from torch's Flight Recorder, written into its
trace as a job ends: what the straggler check compares across ranks.

The tracer sees only calls made through ``torch.distributed``'s Python functions; DDP's
gradient all-reduces and FSDP's gathers are made from C++. The recorder holds every
collective of every process group, whoever made it, with the time it was created (on
gloo and nccl alike): the rank's arrival. Read once per job, without stack frames (28 ms
for the 2000 entries it keeps by default; with frames, torch symbolises them: seconds),
and only for jobs long enough that a straggler could cost something worth a finding.
"""

from __future__ import annotations

import time
from typing import Any

from distdoctor.analysis.stragglers import MIN_JOB_S
from distdoctor.models.events import Ev
from distdoctor.models.plaindata import loads_plain
from distdoctor.trace.cpuwait import cpu_seconds


def write_arrivals(tracer: Any, since: float) -> None:
    """Write the collectives created since ``since`` (this rank's monotonic clock) into
    the trace, with the groups' ranks and the rank's wall-clock offset; nothing when the
    job was short, the recorder is off, or it cannot be read. Never raises."""
    try:
        if time.monotonic() - since < MIN_JOB_S:
            return
        event = arrivals_event(since, getattr(tracer, "cpu_at_start", None))
    # The recorder is evidence, best effort: a missing arrival shows as none; the job's
    # result stands.
    except Exception:  # noqa: BLE001
        return
    if event is not None:
        tracer.write(**event)


def arrivals_event(since: float, cpu_since: tuple[float, float] | None = None
                   ) -> dict | None:
    """The trace event (see write_arrivals), or None without a process group or recorder;
    with the seconds its threads ran on a CPU and waited for one since the job began
    (trace/cpuwait.py), where ``cpu_since`` was read then."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch._C._distributed_c10d import (  # type: ignore[attr-defined]
        _dump_fr_trace,  # in torch's C module, but not in its type stubs
    )

    from distdoctor.dumps.schema import op_of, pg_of, seq_of

    if not dist.is_initialized():
        return None
    offset = time.time() - time.monotonic()
    dump = loads_plain(_dump_fr_trace(True, False, False))
    if not isinstance(dump, dict):
        return None
    default = c10d._get_default_group().group_name
    # the live groups' ranks (gloo's pg_config names none of its groups)
    groups = {str(name): list(dist.get_process_group_ranks(pg))
              for pg, name in c10d._world.pg_names.items()}
    after = (since + offset) * 1e9
    calls = []
    for entry in dump.get("entries") or ():
        created = entry.get("time_created_ns")
        if entry.get("is_p2p") or not isinstance(created, int) or created < after:
            continue
        name, _ = pg_of(entry)
        if name not in groups:
            continue
        calls.append([name, seq_of(entry), op_of(entry.get("profiling_name"))[0],
                      created / 1e9 - offset])
    if not calls:
        return None
    now = cpu_seconds()
    cpu = {"cpu_ran": now[0] - cpu_since[0], "cpu_wait": now[1] - cpu_since[1]} \
        if now is not None and cpu_since is not None else {}
    return {"ev": Ev.ARRIVALS, "offset": offset, "default": default, "groups": groups,
            "calls": calls, **cpu}
