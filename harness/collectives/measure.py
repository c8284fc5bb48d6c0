"""Measured against stated: bytes, steps and time of each collective on real ranks.

Runs over gloo point-to-point with T float32 elements. The formulas are the ones in the
algorithms' docstrings (payload bytes a rank sends, e = 4): ring all-reduce 2(N-1)c*e and
reduce-scatter (N-1)c*e with c = ceil(T/N); all-gather (N-1)(T/N)e; the binomial tree
all-reduce and broadcast send the most from their root, T*ceil(log2 N)*e.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from distdoctor.collectives import algorithms
from distdoctor.collectives.transport import GlooTransport
from distdoctor.launch.pool import shared_pool

NAMES = ("ring-allreduce", "tree-allreduce", "broadcast", "allgather", "reduce-scatter")


@dataclass(frozen=True)
class Row:
    name: str
    bytes_max: int  # the most any rank sent
    bytes_formula: int
    steps: int
    steps_formula: int
    ours_s: float  # median time per call on rank 0
    native_s: float


def formulas(name: str, n: int, numel: int) -> tuple[int, int]:
    """(bytes the busiest rank sends, steps) for T float32 elements on N ranks."""
    e, c, depth = 4, math.ceil(numel / n), math.ceil(math.log2(n))
    return {"ring-allreduce": (2 * (n - 1) * c * e, 2 * (n - 1)),
            "tree-allreduce": (numel * depth * e, 2 * depth),
            "broadcast": (numel * depth * e, depth),
            "allgather": ((n - 1) * (numel // n) * e, n - 1),
            "reduce-scatter": ((n - 1) * c * e, n - 1)}[name]


def measure_job(ctx, name: str, numel: int, repeats: int) -> tuple[int, int, list, list]:
    torch.manual_seed(ctx.rank)
    x = torch.randn(numel if name != "allgather" else numel // ctx.world_size)
    ours, native = [], []
    stats = None
    for _ in range(repeats):
        t = GlooTransport(ctx.rank, ctx.world_size)
        dist.barrier()
        start = time.perf_counter()
        _ours(name, t, x)
        ours.append(time.perf_counter() - start)
        stats = t.stats
        dist.barrier()
        start = time.perf_counter()
        _native(name, x, ctx.world_size)
        native.append(time.perf_counter() - start)
    assert stats is not None  # the transport counted every call above
    return stats.bytes_sent, stats.steps, ours, native


def _ours(name: str, t: GlooTransport, x: torch.Tensor) -> None:
    {"ring-allreduce": lambda: algorithms.ring_allreduce(t, x),
     "tree-allreduce": lambda: algorithms.tree_allreduce(t, x),
     "broadcast": lambda: algorithms.broadcast(t, x, 0),
     "allgather": lambda: algorithms.all_gather(t, x),
     "reduce-scatter": lambda: algorithms.reduce_scatter(t, x)}[name]()


def _native(name: str, x: torch.Tensor, n: int) -> None:
    if name in ("ring-allreduce", "tree-allreduce"):
        dist.all_reduce(x.clone())
    elif name == "broadcast":
        dist.broadcast(x.clone(), src=0)
    elif name == "allgather":
        dist.all_gather([torch.empty_like(x) for _ in range(n)], x)
    else:
        c = math.ceil(x.numel() / n)
        padded = torch.zeros(c * n)
        padded[:x.numel()] = x
        dist.reduce_scatter(torch.empty(c), list(padded.split(c)))


def measure_all(world_size: int, numel: int, repeats: int) -> list[Row]:
    pool = shared_pool(world_size)
    rows = []
    for name in NAMES:
        result = pool.run(measure_job, name, numel, repeats, deadline=120).raise_for_status()
        sent = max(v[0] for v in result.values)
        steps = result.values[0][1]
        bytes_formula, steps_formula = formulas(name, world_size, numel)
        rows.append(Row(name, sent, bytes_formula, steps, steps_formula,
                        statistics.median(result.values[0][2]),
                        statistics.median(result.values[0][3])))
    return rows


def table(rows: list[Row], world_size: int, numel: int) -> str:
    lines = [f"N={world_size}, T={numel} float32 elements, over gloo point-to-point; bytes: "
             f"the most any rank sent; time: median per call on rank 0",
             f"{'collective':<16}{'bytes':>12}{'formula':>12}{'steps':>7}{'formula':>9}"
             f"{'ours ms':>10}{'gloo ms':>10}{'gloo/ours':>11}"]
    for row in rows:
        lines.append(f"{row.name:<16}{row.bytes_max:>12}{row.bytes_formula:>12}"
                     f"{row.steps:>7}{row.steps_formula:>9}{row.ours_s * 1e3:>10.2f}"
                     f"{row.native_s * 1e3:>10.2f}{row.native_s / row.ours_s:>10.2f}x")
    return "\n".join(lines)
