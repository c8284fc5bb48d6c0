"""The pipeline workload: residual blocks, their measured costs, and how to cut them.

Blocks are built in one process order from one seed, so every rank (and the single-process
reference) holds identical parameters for the layers it keeps. Attention is written out as
matmuls: torch's FlopCounterMode counts CPU scaled_dot_product_attention as 0 FLOPs.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from distdoctor.models import PipeShape, RunSpec


class MLPBlock(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


class AttentionBlock(nn.Module):
    """Single-head self-attention: about the parameters of an MLP block, but its score
    matrix costs seq_len^2 per sequence."""

    def __init__(self, d: int):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.q(x) @ self.k(x).transpose(-2, -1) / math.sqrt(x.shape[-1])
        return x + self.o(torch.softmax(scores, dim=-1) @ self.v(x))


BLOCKS = {"m": MLPBlock, "a": AttentionBlock}


def build_layers(shape: PipeShape, seed: int) -> nn.ModuleList:
    unknown = set(shape.layers) - set(BLOCKS)
    if unknown or not shape.layers:
        raise ValueError(f"pipeline layers must be a non-empty string of {set(BLOCKS)}, "
                         f"got {shape.layers!r}")
    torch.manual_seed(seed)
    return nn.ModuleList(BLOCKS[kind](shape.d_model) for kind in shape.layers)


def make_data(spec: RunSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and per-token targets for every sample, identical on every rank."""
    gen = torch.Generator().manual_seed(20_000 + spec.seed)
    shape = spec.pipe
    x = torch.randn(spec.num_samples, shape.seq_len, shape.d_model, generator=gen)
    mix = torch.randn(shape.d_model, shape.d_model, generator=gen) / math.sqrt(shape.d_model)
    return x, torch.tanh(x @ mix)


def step_batch(spec: RunSpec, step: int) -> slice:
    """The samples of optimiser step ``step`` (1-based): consecutive, wrapping around."""
    start = ((step - 1) * spec.batch_size) % (spec.num_samples - spec.batch_size + 1)
    return slice(start, start + spec.batch_size)


@dataclass(frozen=True)
class LayerCost:
    params: int
    forward_flops: int
    backward_flops: int


def layer_costs(layers: nn.ModuleList, shape: PipeShape, micro_size: int) -> list[LayerCost]:
    """Parameters and FLOPs of every layer for one micro-batch, counted by torch: once per
    block kind (blocks of a kind have the same shapes, so the same counts), as counting
    costs ~8 ms a block."""
    counted: dict[str, LayerCost] = {}
    for layer, kind in zip(layers, shape.layers):
        if kind in counted:
            continue
        x = torch.randn(micro_size, shape.seq_len, shape.d_model, requires_grad=True)
        with FlopCounterMode(display=False) as forward:
            out = layer(x)
        with FlopCounterMode(display=False) as backward:
            out.sum().backward()
        layer.zero_grad(set_to_none=True)
        counted[kind] = LayerCost(sum(p.numel() for p in layer.parameters()),
                                  forward.get_total_flops(), backward.get_total_flops())
    return [counted[kind] for kind in shape.layers]


def kind_times(layers: nn.ModuleList, shape: PipeShape, micro_size: int,
               warm_rounds: int = 8, rounds: int = 15, chain: int = 3) -> list[float]:
    """CPU seconds of one forward and backward on one micro-batch, per layer, one figure
    per block kind: the cost a FLOP counter misses (softmax, transposes).

    Blocks of one kind run the same computation on the same shapes, so they differ by
    noise alone, and one figure per kind keeps that noise from moving the cut. Each kind
    is timed as a chain of up to ``chain`` of its blocks run through together, as a stage
    runs them (one block per backward call would charge the autograd engine's per-call
    cost to every block, and most to the cheapest kind). The kinds are measured in
    interleaved rounds, after warm-up rounds, and the median round is kept: a process's
    first ~20 passes run up to twice as slow as later ones (allocator and caches), so
    measuring the layers in order, as an earlier version did, charged that warm-up to the
    MLP blocks that come first and cut attention-heavy stages too big (measured: 1.2-1.3x
    the mean stage time at N=4)."""
    by_kind: dict[str, list[nn.Module]] = {}
    for layer, kind in zip(layers, shape.layers):
        by_kind.setdefault(kind, []).append(layer)
    chains = {kind: nn.Sequential(*blocks[:chain]) for kind, blocks in by_kind.items()}
    samples: dict[str, list[float]] = {kind: [] for kind in chains}
    size = (micro_size, shape.seq_len, shape.d_model)
    for round_ in range(warm_rounds + rounds):
        for kind, blocks in chains.items():
            x, grad = torch.randn(size, requires_grad=True), torch.randn(size)
            start = time.thread_time()
            blocks(x).backward(grad)
            if round_ >= warm_rounds:
                samples[kind].append((time.thread_time() - start) / len(blocks))
    for layer in layers:
        layer.zero_grad(set_to_none=True)
    median = {kind: statistics.median(v) for kind, v in samples.items()}
    return [median[kind] for kind in shape.layers]


def partition(weights: list[float], parts: int) -> list[tuple[int, int]]:
    """Cut ``weights`` into ``parts`` contiguous [start, end) runs, minimising the largest
    run's total (exact, by dynamic programming over prefixes)."""
    n = len(weights)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot cut {n} layers into {parts} stages")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    best = [[math.inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for end in range(k, n - (parts - k) + 1):
            for start in range(k - 1, end):
                value = max(best[k - 1][start], prefix[end] - prefix[start])
                if value < best[k][end] - 1e-12:
                    best[k][end], cut[k][end] = value, start
    bounds, end = [], n
    for k in range(parts, 0, -1):
        bounds.append((cut[k][end], end))
        end = cut[k][end]
    return bounds[::-1]


def balance_ranks(weights: list[float], bounds: list[tuple[int, int]],
                  owner: list[int]) -> list[tuple[int, int]]:
    """Move cut points one layer at a time while that lowers the heaviest rank's load.

    When a rank holds several stages (interleaved, V-shaped), equal stages need not give
    equal ranks; this hill-climb starts from the best cut per stage and stops at the first
    cut no single move improves."""
    cuts = [end for _, end in bounds[:-1]]

    def worst(cuts: list[int]) -> float:
        edges = [0, *cuts, len(weights)]
        load: dict[int, float] = {}
        for stage, (a, b) in enumerate(zip(edges, edges[1:])):
            load[owner[stage]] = load.get(owner[stage], 0.0) + sum(weights[a:b])
        return max(load.values())

    best = worst(cuts)
    improved = True
    while improved:
        improved = False
        for i in range(len(cuts)):
            for step in (-1, 1):
                moved = cuts[:i] + [cuts[i] + step] + cuts[i + 1:]
                edges = [0, *moved, len(weights)]
                if any(b <= a for a, b in zip(edges, edges[1:])):
                    continue
                value = worst(moved)
                if value < best - 1e-12:
                    cuts, best, improved = moved, value, True
    edges = [0, *cuts, len(weights)]
    return list(zip(edges, edges[1:]))


def split_layers(spec: RunSpec, costs: list[LayerCost], owner: list[int],
                 times: list[float] | None = None) -> list[tuple[int, int]]:
    """The stage boundaries the spec's knob asks for (by parameter count, FLOPs or time),
    balanced per rank when ranks hold several stages (``owner``: the rank of each stage)."""
    weights: list[float]
    if spec.knobs.stage_split == "params":
        weights = [float(c.params) for c in costs]
    elif spec.knobs.stage_split == "time":
        if times is None:
            raise ValueError("a split by time needs the layers' measured times")
        weights = times
    else:
        weights = [c.forward_flops + c.backward_flops for c in costs]
    bounds = partition(weights, len(owner))
    return bounds if len(set(owner)) == len(owner) else balance_ranks(weights, bounds, owner)
