"""Fresh rank start-up versus a job on a warm pool, measured side by side in one run.

For N = 2 and 4: (a) a fresh group the usual way, spawned processes (what mp.spawn and
torchrun do) that import torch, rendezvous on a file:// store and all-reduce once;
(b) a fresh group from distdoctor's launch(), forked from this already-warm parent;
(c) the same all-reduce job on a warm RankPool, median of many jobs. Ratios, not seconds,
are the result: this machine is noisy.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from distdoctor.launch.pool import RankPool, launch  # noqa: E402

WARM_JOBS = 60


def allreduce_job(ctx) -> float:
    tensor = torch.ones(4)
    dist.all_reduce(tensor)
    return float(tensor[0])


def _spawned_rank(rank: int, world_size: int, init_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size)
    tensor = torch.ones(4)
    dist.all_reduce(tensor)
    assert tensor[0] == world_size
    dist.destroy_process_group()


def spawn_fresh(world_size: int) -> float:
    with tempfile.TemporaryDirectory() as directory:
        start = time.perf_counter()
        tmp.start_processes(_spawned_rank, args=(world_size, os.path.join(directory, "rdzv")),
                            nprocs=world_size, start_method="spawn")
        return time.perf_counter() - start


def fork_fresh(world_size: int) -> float:
    start = time.perf_counter()
    launch(allreduce_job, world_size=world_size, deadline=60).raise_for_status()
    return time.perf_counter() - start


def warm(pool: RankPool) -> float:
    start = time.perf_counter()
    pool.run(allreduce_job, deadline=60).raise_for_status()
    return time.perf_counter() - start


def median_of(fn, repeats: int, *args) -> float:
    return statistics.median(fn(*args) for _ in range(repeats))


def main() -> None:
    smoke = "--smoke" in sys.argv[1:]  # the suite's run: N=2, each way once or a few times
    spawns, forks, jobs = (1, 1, 3) if smoke else (3, 10, WARM_JOBS)
    print(f"torch {torch.__version__}, {os.cpu_count()} cores; medians; "
          f"fresh spawn x{spawns}, fresh fork x{forks}, warm x{jobs}", flush=True)
    rows = []
    for world_size in (2,) if smoke else (2, 4):
        print(f"measuring N={world_size} ...", flush=True)
        spawned = median_of(spawn_fresh, spawns, world_size)
        forked = median_of(fork_fresh, forks, world_size)
        with RankPool(world_size) as pool:
            warm(pool)
            warmed = median_of(warm, jobs, pool)
        rows.append((world_size, spawned, forked, warmed))
    print()
    print(f"{'N':>2}  {'fresh spawn':>12}  {'fresh fork':>11}  {'warm job':>9}  "
          f"{'spawn/warm':>10}  {'fork/warm':>9}")
    for world_size, spawned, forked, warmed in rows:
        print(f"{world_size:>2}  {spawned * 1e3:>9.0f} ms  {forked * 1e3:>8.1f} ms  "
              f"{warmed * 1e3:>6.2f} ms  {spawned / warmed:>9.0f}x  {forked / warmed:>8.1f}x")


if __name__ == "__main__":
    main()
