"""How soon each provable deadlock is named, with ``--deadline 300``, by ``distdoctor run``.

For each hanging script (written to a temporary directory): the time from the last rank
entering its blocking call (its tracer's timestamp, on the machine-wide monotonic clock)
to the job's end (the watch stopping the ranks, or, where gloo fails a call because its peer
exited, the last rank ending), and to the diagnosis being rendered. Before the wait-for
proof, each of these waited out the deadline (then deadline + 0.6-1.0 s). Target: at most
0.5 s to the diagnosis.

    python bench/hang_time.py [REPEATS]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROLOGUE = """import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.zeros(4)
"""
SCRIPTS = {  # name -> (ranks, body)
    "send cycle, N=2": (2, "dist.send(t, (rank + 1) % world)\n"),
    "send cycle, N=4": (4, "dist.send(t, (rank + 1) % world)\n"),
    "receive cycle, N=2": (2, "dist.recv(t, (rank + 1) % world)\n"),
    "mismatched collectives": (2, "dist.all_reduce(t) if rank == 0 else dist.broadcast(t, 0)\n"),
    "collective, a rank exited": (2, "if rank == 0:\n    dist.all_reduce(t)\n"),
    "receive from an exited rank": (2, "if rank == 0:\n    dist.recv(t, 1)\n"),
}
DEADLINE = 300.0


def measure(path: str, ranks: int) -> tuple[float, float, str]:
    import checks
    from harness.cli.run import _record
    from harness.doctor.launcher import run_script
    from harness.doctor.report import render, report

    result = run_script(path, [], ranks, DEADLINE, echo=False, light=True)
    record = _record(result.ends, result.traces, result.wall_s, result.started, DEADLINE)
    render(report(record, checks.run_all(record), path))
    rendered = time.monotonic()
    # a call that never returned: still blocked, or ended by an error (a peer that exits
    # closes its sockets, and gloo then fails the waiting rank's call at once)
    blocked = max(c.entered for r in record.ranks for c in r.evidence.calls
                  if c.completed is None)
    stopped = result.started + max(e.at or 0.0 for e in result.ends)
    cause = report(record, checks.run_all(record), path).cause
    return stopped - blocked, rendered - blocked, cause.kind if cause else "ok"


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print(f"distdoctor run --deadline {DEADLINE:g}: seconds from the last rank blocking, "
          f"median of {repeats}")
    print(f"{'deadlock':<30} {'stopped':>8} {'diagnosed':>10}  cause")
    with tempfile.TemporaryDirectory() as folder:
        for name, (ranks, body) in SCRIPTS.items():
            path = os.path.join(folder, f"deadlock{len(os.listdir(folder))}.py")
            with open(path, "w") as script:
                script.write(PROLOGUE + body)
            runs = [measure(path, ranks) for _ in range(repeats)]
            stopped = statistics.median(r[0] for r in runs)
            diagnosed = statistics.median(r[1] for r in runs)
            print(f"{name:<30} {stopped:>8.2f} {diagnosed:>10.2f}  {runs[-1][2]}", flush=True)


if __name__ == "__main__":
    main()
