"""The same stages under torch.distributed.pipelining's own schedules.

GPipe and 1F1B hold one stage per rank. Interleaved 1F1B loops 2N stages over N ranks
(stage k on rank k % N); ZBV and DualPipeV fold them into a V (rank r holds stages r and
2N-1-r). torch scales gradients by 1/n_microbatches, so a mean loss per micro-batch
trains exactly like the mean over the whole batch.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage, schedules

from distdoctor.models import StageEvent
from distdoctor.pipeline import TORCH_SCHEDULES


def stage_ranks(world: int, per_rank: int, style: str) -> list[int]:
    """The rank holding each stage."""
    total = world * per_rank
    if style == "v":
        return [k if k < world else total - 1 - k for k in range(total)]
    return [k % world for k in range(total)]


def time_chunks(stage: PipelineStage, index: int, clock: dict,
                record: Callable[[StageEvent], None]) -> None:
    """Record every forward, backward and weight-backward chunk the schedule runs on
    ``stage``, by wrapping the stage's own per-chunk methods (the micro-batch id is their
    first argument). ``clock["step"]`` says which optimiser step is running."""
    for method, kind in (("forward_one_chunk", "F"), ("backward_one_chunk", "B"),
                         ("backward_weight_one_chunk", "W")):
        inner = getattr(stage, method)

        def timed(chunk, *args, _inner=inner, _kind=kind, **kwargs):
            start, cpu = time.monotonic(), time.thread_time()
            result = _inner(chunk, *args, **kwargs)
            record(StageEvent(clock["step"], index, chunk, _kind, start, time.monotonic(),
                              time.thread_time() - cpu))
            return result

        setattr(stage, method, timed)


class TorchPipeline:
    def __init__(self, strategy: str, modules: dict[int, nn.Module], world: int, micro: int,
                 loss_fn: Callable, record: Callable[[StageEvent], None]):
        class_name, per_rank, _ = TORCH_SCHEDULES[strategy]
        self.total = world * per_rank
        self.held = set(modules)
        self.clock = {"step": 0}
        stages = [PipelineStage(m, k, self.total, torch.device("cpu"))
                  for k, m in sorted(modules.items())]
        for stage in stages:
            time_chunks(stage, stage.stage_index, self.clock, record)
        schedule_class = getattr(schedules, class_name)
        self.schedule = schedule_class(stages if per_rank > 1 else stages[0],
                                       n_microbatches=micro, loss_fn=loss_fn)

    def step(self, step: int, x: torch.Tensor, y: torch.Tensor) -> float | None:
        self.clock["step"] = step
        holds_first, holds_last = 0 in self.held, self.total - 1 in self.held
        losses: list[torch.Tensor] = []
        kwargs = {"target": y, "losses": losses} if holds_last else {}
        self.schedule.step(*((x,) if holds_first else ()), **kwargs)
        return sum(loss.item() for loss in losses) / len(losses) if holds_last else None
