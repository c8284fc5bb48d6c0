"""The whole fault matrix end to end: warm pools against a fresh process group per run.

Every fault x variant x strategy x N in {2, 4} is diagnosed (a faulty run, then a fixed
run) three times in one process: on warm pools; forming a new group for every run forked
from this warm parent (distdoctor's cheapest fresh start); and spawning a new group for
every run (what mp.spawn and torchrun do: every rank imports torch). Ratios are the
result; `--no-spawn` skips the slow third sweep.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from distdoctor import faults  # noqa: E402
from distdoctor.faultloop.diagnose import diagnose  # noqa: E402
from distdoctor.launch.pool import RankPool, shared_pool  # noqa: E402
from distdoctor.models import RunSpec  # noqa: E402


class FreshGroupPerRun:
    """Quacks like a RankPool, but forms and reaps a new group for every job."""

    def __init__(self, world_size: int, start_method: str):
        self.world_size = world_size
        self.start_method = start_method

    def run(self, fn, *args, **kwargs):
        with RankPool(self.world_size, start_method=self.start_method) as pool:
            return pool.run(fn, *args, **kwargs)


SMOKE = "--smoke" in sys.argv[1:]  # the suite's run: the first two cases, no spawned sweep


def cases():
    if SMOKE:
        yield from list(_every_case())[:2]
    else:
        yield from _every_case()


def _every_case():
    for fault in faults.catalogue().values():
        for variant in fault.variants:
            for strategy in fault.strategies:
                for world_size in (2, 4):
                    yield fault, variant.name, strategy, world_size


def sweep(pool_for) -> tuple[float, int, int]:
    start = time.perf_counter()
    runs = passed = 0
    for fault, variant, strategy, world_size in cases():
        report = diagnose(fault, RunSpec(strategy=strategy, world_size=world_size), variant,
                          pool_for(world_size))
        runs += 1 + (report.fixed_record is not None)
        passed += report.verdict.passed
    return time.perf_counter() - start, runs, passed


def main() -> None:
    count = len(list(cases()))
    print(f"{count} diagnoses (fault x variant x strategy x N in 2, 4), each one or two runs",
          flush=True)
    for n in (2, 4):
        shared_pool(n).start()  # warm pools are formed once, outside the timing
    warm, runs, passed = sweep(shared_pool)
    print(f"warm pools:                  {warm:7.2f} s  ({runs} runs, {passed}/{count} pass)",
          flush=True)
    forked, runs, passed = sweep(lambda n: FreshGroupPerRun(n, "fork"))
    print(f"forked group per run:        {forked:7.2f} s  ({runs} runs, {passed}/{count} pass)"
          f"  {forked / warm:6.2f}x warm", flush=True)
    if "--no-spawn" not in sys.argv and not SMOKE:
        spawned, runs, passed = sweep(lambda n: FreshGroupPerRun(n, "spawn"))
        print(f"spawned group per run:       {spawned:7.2f} s  ({runs} runs, {passed}/{count} "
              f"pass)  {spawned / warm:6.2f}x warm")


if __name__ == "__main__":
    main()
