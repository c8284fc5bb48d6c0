"""The pipeline training job a rank runs, hand-rolled or under torch's schedules.

Every rank builds all layers from one seed and keeps its stages, cut by the spec's
``stage_split`` knob: FLOPs torch counted, parameter counts, or CPU time measured per block
kind on every rank (the median rank's). It records the cost of
its stages, every forward and backward with wall and CPU times, and per step its loss (last
stage), gradients and parameters.
"""

from __future__ import annotations

import time
import warnings

import torch
import torch.distributed as dist
from torch import nn

from distdoctor.launch.rank import RankContext
from distdoctor.models import PipeStepEvidence, RunSpec, StageCost
from distdoctor.models.events import Emit
from distdoctor.pipeline import HANDROLLED, TORCH_SCHEDULES, handrolled
from distdoctor.pipeline.model import (
    build_layers,
    kind_times,
    layer_costs,
    make_data,
    split_layers,
    step_batch,
)
from distdoctor.pipeline.torchpipe import TorchPipeline, stage_ranks
from distdoctor.training.fingerprint import fingerprint


def stage_layout(strategy: str, world: int) -> list[int]:
    """The rank that holds each stage of ``strategy`` on ``world`` ranks."""
    if strategy in HANDROLLED:
        return list(range(world))
    _, per_rank, style = TORCH_SCHEDULES[strategy]
    return stage_ranks(world, per_rank, style)


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out, target)


def _agreed_times(layers: nn.ModuleList, spec: RunSpec, micro: int) -> list[float] | None:
    """Per-layer CPU times measured on every rank, the median rank's kept, so that every
    rank cuts the layers at the same places (only for a split by time). The median, not
    the mean: one rank whose core was busy while it measured must not move the cut."""
    if spec.knobs.stage_split != "time":
        return None
    mine = torch.tensor(kind_times(layers, spec.pipe, spec.batch_size // micro),
                        dtype=torch.float64)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return torch.stack(every).median(dim=0).values.tolist()


def pipeline_job(ctx: RankContext, spec: RunSpec) -> None:
    """Train ``spec``'s pipeline on this rank, with subnormal floats flushed to zero.

    As the residual stream grows through the blocks, attention's softmax puts out
    subnormal floats, which a CPU handles up to 5x slower (measured: one attention block
    1.6 ms on inputs of scale 1, 9.0 ms at scale 10, 1.7 ms flushed). Their cost depends on
    the data and drifts as training goes, so neither a calibration on random inputs nor
    one step's time would predict another's; GPUs flush them by default. The change to the
    numbers is below 1e-38, far under every tolerance."""
    torch.set_flush_denormal(True)
    try:
        _train_pipeline(ctx, spec)
    finally:
        torch.set_flush_denormal(False)  # a pool rank's next job starts as torch does


def _train_pipeline(ctx: RankContext, spec: RunSpec) -> None:
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    layers = build_layers(spec.pipe, spec.seed)
    micro = spec.micro_batches
    costs = layer_costs(layers, spec.pipe, spec.batch_size // micro)
    ctx.progress()  # set-up is work too: a slow one on a busy machine is not a hang
    owner = stage_layout(spec.strategy, ctx.world_size)
    if len(layers) < len(owner):
        raise ValueError(f"{len(layers)} layers cannot fill {len(owner)} stages")
    times = _agreed_times(layers, spec, micro)
    ctx.progress()
    bounds = split_layers(spec, costs, owner, times)
    mine = [k for k, rank in enumerate(owner) if rank == ctx.rank]
    modules = {k: nn.Sequential(*layers[bounds[k][0]:bounds[k][1]]) for k in mine}
    ctx.emit((Emit.HOLDS, "stage" + "s" * (len(mine) > 1) + " " + ", ".join(map(str, mine))))
    for k in mine:
        first, past = bounds[k]
        ctx.emit((Emit.STAGE, StageCost(k, first, past, spec.pipe.layers[first:past],
                                     sum(c.params for c in costs[first:past]),
                                     sum(c.forward_flops for c in costs[first:past]),
                                     sum(c.backward_flops for c in costs[first:past]))))
    params = [p for k in mine for p in modules[k].parameters()]
    optimizer = torch.optim.SGD(params, lr=spec.learning_rate)
    x, y = make_data(spec)
    record = lambda event: ctx.emit((Emit.STAGE_EVENT, event))  # noqa: E731
    runner = None if spec.strategy in HANDROLLED else TorchPipeline(
        spec.strategy, dict(modules), ctx.world_size, micro, loss_fn, record)
    for step in range(1, spec.num_steps + 1):
        batch = step_batch(spec, step)
        optimizer.zero_grad(set_to_none=True)
        start = time.monotonic()
        if runner is None:
            loss = handrolled.run_step(
                HANDROLLED[spec.strategy], modules[ctx.rank], ctx.rank, ctx.world_size, step,
                list(x[batch].chunk(micro)), list(y[batch].chunk(micro)), loss_fn,
                spec.knobs.p2p_order, record)
        else:
            loss = runner.step(step, x[batch], y[batch])
        end = time.monotonic()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        grad_print = fingerprint(grads, spec.fingerprint_values)
        optimizer.step()
        ctx.emit((Emit.PIPE_STEP, PipeStepEvidence(step, loss, fingerprint(
            params, spec.fingerprint_values), grad_print, start, end)))
