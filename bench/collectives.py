"""Our ring all-reduce over gloo point-to-point against gloo's own all-reduce.

For T from 1e3 to 1e7 float32 elements and N = 2 and 4, both run on the same warm ranks,
alternating, several times each; the result is the throughput ratio (gloo time / ours)
per size, measured side by side.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from distdoctor.collectives.algorithms import ring_allreduce  # noqa: E402
from distdoctor.collectives.transport import GlooTransport  # noqa: E402
from distdoctor.launch.pool import RankPool  # noqa: E402

SIZES = (1_000, 10_000, 100_000, 1_000_000, 10_000_000)


def race(ctx, numel: int, repeats: int) -> tuple[float, float]:
    """Median seconds per call: (ours, gloo's), alternating on the same data."""
    x = torch.randn(numel, generator=torch.Generator().manual_seed(ctx.rank))
    ours, native = [], []
    for i in range(repeats):
        for which in ((0, 1) if i % 2 == 0 else (1, 0)):
            dist.barrier()
            start = time.perf_counter()
            if which == 0:
                ring_allreduce(GlooTransport(ctx.rank, ctx.world_size), x)
            else:
                dist.all_reduce(x.clone())
            (ours if which == 0 else native).append(time.perf_counter() - start)
    return statistics.median(ours), statistics.median(native)


def main() -> None:
    smoke = "--smoke" in sys.argv[1:]  # the suite's run: two small sizes, N=2, few repeats
    print(f"ring all-reduce over gloo point-to-point vs gloo's all_reduce, float32, "
          f"{os.cpu_count()} cores; medians, alternating")
    print(f"{'N':>2} {'T':>10} {'ours ms':>9} {'gloo ms':>9} {'throughput ratio':>17}")
    for world_size in (2,) if smoke else (2, 4):
        with RankPool(world_size) as pool:
            for numel in SIZES[:2] if smoke else SIZES:
                repeats = (3 if smoke else 30 if numel <= 100_000 else
                           11 if numel <= 1_000_000 else 5)
                result = pool.run(race, numel, repeats, deadline=300).raise_for_status()
                ours, native = result.values[0]
                print(f"{world_size:>2} {numel:>10} {ours * 1e3:>9.2f} {native * 1e3:>9.2f} "
                      f"{native / ours:>16.2f}x", flush=True)


if __name__ == "__main__":
    main()
