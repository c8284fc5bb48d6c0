"""Rebalancing pays off in step time; measured bubble beside the simulator's.

For S = 2 and 4 on warm pools, the unbalanced-stages workload is trained with stages cut
by parameter count and cut by measured time, alternating, several runs each; the ratio of
median step times is the result (measured side by side, so machine noise hits both). Then
each real schedule's measured bubble is printed beside the simulator's for the same S, M
and the run's own per-stage times and hop latency.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from distdoctor import faults  # noqa: E402
from distdoctor.analysis.timing import per_rank_times  # noqa: E402
from distdoctor.cli.tables import step_time  # noqa: E402
from distdoctor.faultloop.runspec import run  # noqa: E402
from distdoctor.models import Knobs, PipeShape, RunSpec  # noqa: E402
from distdoctor.pipeline.report import measured_bubble, simulated_for  # noqa: E402
from distdoctor.pipeline.simulate import simulate  # noqa: E402

SMOKE = "--smoke" in sys.argv[1:]  # the suite's run: S=2, one run each, two schedules
REPEATS = 1 if SMOKE else 5


def balance(record) -> float:
    times = per_rank_times(record)
    return max(times.values()) / (sum(times.values()) / len(times))


def rebalancing(world_size: int) -> None:
    base = faults.get("unbalanced-stages").scenario(
        RunSpec(strategy="pipe-1f1b", world_size=world_size))
    runs = {"params": [], "time": []}
    for _ in range(REPEATS):
        for split in runs:
            runs[split].append(run(dataclasses.replace(base, knobs=Knobs(stage_split=split))))
    step = {k: statistics.median(step_time(r) for r in v) for k, v in runs.items()}
    ratio = {k: statistics.median(balance(r) for r in v) for k, v in runs.items()}
    print(f"S={world_size}: stage time max/mean {ratio['params']:.2f} cut by params, "
          f"{ratio['time']:.2f} cut by time; step {step['params'] * 1e3:.1f} ms -> "
          f"{step['time'] * 1e3:.1f} ms: {step['params'] / step['time']:.2f}x faster "
          f"({REPEATS} runs each, alternating, {os.cpu_count()} cores)", flush=True)


def bubbles() -> None:
    shape = PipeShape(seq_len=256, d_model=64)
    strategies = ("pipe-gpipe", "pipe-1f1b", "torch-pipe-gpipe", "torch-pipe-1f1b",
                  "torch-pipe-interleaved", "torch-pipe-dualpipev")
    for strategy in strategies[:1] if SMOKE else strategies:
        for world_size in (2,) if SMOKE else (2, 4):
            record = run(RunSpec(strategy=strategy, world_size=world_size, batch_size=32,
                                 micro_batches=8, num_steps=4, pipe=shape))
            name, timeline = simulated_for(record)
            free = simulate(timeline.schedule, dataclasses.replace(timeline.costs, comm=0.0))
            print(f"{strategy:<24} S={world_size} M=8  measured {measured_bubble(record):6.2%}  "
                  f"simulated {name} {free.bubble_fraction:6.2%}, with hop latency "
                  f"{timeline.costs.comm * 1e3:.2f} ms {timeline.bubble_fraction:6.2%}", flush=True)


if __name__ == "__main__":
    print("rebalancing (unbalanced-stages workload, 1F1B):")
    for world_size in (2,) if SMOKE else (2, 4):
        rebalancing(world_size)
    print("\nbubble, real run against the simulator with the run's own costs:")
    bubbles()
