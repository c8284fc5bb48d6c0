"""A DDP model's buffers, sampled as its training forwards begin: the evidence that the
replicas hold one state beyond their parameters (BatchNorm's running statistics kept per
rank when ``broadcast_buffers=False`` and no SyncBatchNorm: the model each rank evaluates
and saves then differs).

The sample is taken by a forward pre-hook of the wrapped module, only inside DDP's own
training forward (``tracer.forwarding``): after DDP has broadcast rank 0's buffers, when
it does, and before the forward updates them with the rank's own batch. A forward of the
module outside DDP (evaluation through ``model.module``) is not sampled. Only on the
optimiser steps whose gradients are sampled (gradients.sampled), once each: a few values
of every floating-point buffer, at the same positions on every rank.
"""

from __future__ import annotations

from typing import Any

import torch

from distdoctor.analysis.positions import spread_positions
from distdoctor.models.events import Ev
from distdoctor.trace.gradients import sampled
from distdoctor.trace.tracer import incomplete, user_line

PER_BUFFER = 4  # values sampled of each buffer


def record_buffers(tracer: Any) -> None:
    """Sample every DDP model's buffers from now on (tracer.on_ddp)."""

    def on_ddp(ddp: Any) -> None:
        done: list[int] = [0]  # the last step sampled

        def before_forward(module: torch.nn.Module, _args: Any) -> None:
            step = tracer.optimizer_steps + 1
            if tracer.forwarding is not ddp or not sampled(step) or done[0] == step:
                return
            done[0] = step
            try:
                names, values = [], []
                for name, buffer in module.named_buffers():
                    if buffer.is_floating_point() and buffer.numel():
                        flat = buffer.detach().reshape(-1)
                        at = torch.tensor(spread_positions(flat.numel(), PER_BUFFER))
                        names.append(name)
                        values.append(flat[at].double().cpu().tolist())
                if names:
                    tracer.write(ev=Ev.BUFFERS, step=step, names=names, values=values,
                                 where=user_line())
            # Reported as incomplete evidence, below; evidence is best effort: never break the
            # forward.
            except Exception as exc:  # noqa: BLE001
                incomplete("DDP's buffers", exc)

        ddp.module.register_forward_pre_hook(before_forward)

    tracer.on_ddp.append(on_ddp)

