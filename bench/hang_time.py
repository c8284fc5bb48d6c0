"""How soon each provable deadlock is named, with the default deadline of 300 s, at 2 to
32 ranks, side by side with the timer alone.

Part 1, ``distdoctor run`` on hanging scripts (written to a temporary directory), each at
2, 4, 8, 16 and 32 ranks: the seconds from the last rank entering its blocking call (its
tracer's timestamp, on the machine-wide monotonic clock) to the diagnosis being rendered,
and the cause and culprits it names. The cases: a collective only rank 0 makes, which gloo
pairs silently with the others' next one (every rank then blocks at the same line: proven
from the history of the group's calls); the same with 1,000 elements, where gloo aborts
rank 0 on the size mismatch; a send cycle; a rank that exits while the others wait in a
collective. Part 2 has the other deadlocks at their own sizes, with the time to the job's
end as well. Before the wait-for proof each of these waited out the deadline. Target: at
most 0.5 s to the diagnosis.

Part 3, ``distdoctor check-collective`` judging a ring all-reduce whose ranks all send
before they receive, on the rendezvous transport (a send returns once received, as on
gloo), up to 40 examples at world sizes 2-4: the whole command's wall time with the proof
at the new default deadline (300 s), and with the timer alone (DISTDOCTOR_PROOF=0) at the
old default (2 s) and at 30 s; at 300 s the timer alone would wait at least 300 s (not
run).

    python bench/hang_time.py [REPEATS] [--sizes 2,4,8,16,32]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

PROLOGUE = """import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.zeros(4)
"""
DDP_LOG = """import torch.nn as nn
model = nn.parallel.DistributedDataParallel(nn.Linear(4, 4))
for step in range(3):
    model(torch.randn(2, 4)).sum().backward()
    if rank == 0:
        dist.all_reduce(t)  # DDP's own broadcast, from C++, meets it on rank 1
"""
RANK_ZERO_EXTRA = """for step in range(3):
    dist.all_reduce(t)
    if rank == 0 and step == 1:
        dist.all_reduce(torch.ones(1))  # rank 0 only: a metric
"""
GROWING = {  # name -> body, run at every size
    "rank 0's extra, paired": RANK_ZERO_EXTRA,
    "rank 0's extra, aborts": "t = torch.zeros(1000)\n" + RANK_ZERO_EXTRA,
    "send cycle": "dist.send(t, (rank + 1) % world)\n",
    # the others are past init_process_group's connections before rank 0 leaves
    "a rank exited": "dist.all_reduce(t)\nif rank != 0:\n    dist.all_reduce(t)\n",
}
SIZES = (2, 4, 8, 16, 32)
SCRIPTS = {  # name -> (ranks, body)
    "receive cycle, N=2": (2, "dist.recv(t, (rank + 1) % world)\n"),
    "mismatched collectives": (2, "dist.all_reduce(t) if rank == 0 else dist.broadcast(t, 0)\n"),
    "receive from an exited rank": (2, "if rank == 0:\n    dist.recv(t, 1)\n"),
    "rank 0's collective vs DDP's": (2, DDP_LOG),
}
DEADLINE = 300.0
RING = "collective_impls:ring_allreduce_send_first"


def measure(path: str, ranks: int) -> tuple[float, float, str, str]:
    from distdoctor.models.calls import ranks_phrase
    from distdoctor.userjob.launching.launcher import run_script
    from distdoctor.userjob.reporting.record import explain, script_record
    from distdoctor.userjob.reporting.report import look_at, render

    result = run_script(path, [], ranks, DEADLINE, echo=False, light=True)
    record = script_record(result.ends, result.traces, result.wall_s, result.started, DEADLINE)
    cause = explain(record, path)
    render(cause)
    rendered = time.monotonic()
    # a call that never returned: still blocked, or ended by an error (a peer that exits
    # closes its sockets, and gloo then fails the waiting rank's call at once)
    blocked = max(c.entered for r in record.ranks for c in r.evidence.calls
                  if c.completed is None)
    stopped = result.started + max(e.at or 0.0 for e in result.ends)
    named = f"{cause.cause.kind} ({ranks_phrase(cause.cause.ranks)})" if cause.cause else "ok"
    return stopped - blocked, rendered - blocked, named, ", ".join(
        os.path.basename(line) for line in look_at(cause)[:2])


def judge_ring(deadline: float, proof: bool) -> tuple[float, str]:
    """check-collective's wall time on the send-first ring, rendezvous transport."""
    from distdoctor.analysis.waitfor import PROOF_SWITCH
    from distdoctor.collectives.checker import check

    os.environ[PROOF_SWITCH] = "1" if proof else "0"
    try:
        start = time.monotonic()
        failure, _ = check(RING, "allreduce", "sum", (2, 4), 40, deadline, ("rendezvous",))
        return time.monotonic() - start, failure.what if failure else "passed"
    finally:
        os.environ.pop(PROOF_SWITCH)


def main() -> None:
    smoke = "--smoke" in sys.argv[1:]  # the suite's run: one case once, no timer-alone runs
    numbers = [a for a in sys.argv[1:] if a.isdigit()]
    repeats = 1 if smoke else int(numbers[0]) if numbers else 3
    sizes = SIZES[:1] if smoke else SIZES
    if "--sizes" in sys.argv:
        sizes = tuple(int(n) for n in sys.argv[sys.argv.index("--sizes") + 1].split(","))
    with tempfile.TemporaryDirectory() as folder:
        print(f"distdoctor run --deadline {DEADLINE:g}: seconds from the last rank blocking "
              f"to the diagnosis, median of {repeats}, by ranks")
        print(f"{'deadlock':<24}" + "".join(f"{n:>7}" for n in sizes) + "  named (largest)")
        for name, body in list(GROWING.items())[:1 if smoke else None]:
            path = write(folder, body)
            row, named = [], ""
            for ranks in sizes:
                runs = [measure(path, ranks) for _ in range(repeats)]
                row.append(statistics.median(r[1] for r in runs))
                named = f"{runs[-1][2]} at {runs[-1][3]}"
            print(f"{name:<24}" + "".join(f"{t:>7.2f}" for t in row) + f"  {named}",
                  flush=True)
        if not smoke:
            print(f"\n{'other deadlocks':<30} {'stopped':>8} {'diagnosed':>10}  cause")
            for name, (ranks, body) in SCRIPTS.items():
                runs = [measure(write(folder, body), ranks) for _ in range(repeats)]
                stopped = statistics.median(r[0] for r in runs)
                diagnosed = statistics.median(r[1] for r in runs)
                print(f"{name:<30} {stopped:>8.2f} {diagnosed:>10.2f}  {runs[-1][2]}",
                      flush=True)
    print(f"\ncheck-collective {RING} --kind allreduce --transport rendezvous "
          f"--world-sizes 2-4 --examples 40: wall seconds, one run each")
    for label, deadline, proof in (("proof, --deadline 300", 300.0, True),
                                   ("timer alone, --deadline 2", 2.0, False),
                                   ("timer alone, --deadline 30", 30.0, False))[:1 if smoke else 3]:
        seconds, verdict = judge_ring(deadline, proof)
        print(f"  {label:<28} {seconds:7.1f} s  ({verdict})", flush=True)


def write(folder: str, body: str) -> str:
    path = os.path.join(folder, f"deadlock{len(os.listdir(folder))}.py")
    with open(path, "w") as script:
        script.write(PROLOGUE + body)
    return path


if __name__ == "__main__":
    main()
