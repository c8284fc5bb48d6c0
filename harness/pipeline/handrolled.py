"""GPipe and 1F1B written out over blocking point-to-point calls.

One stage per rank. A rank walks its action list (the one the simulator uses): a forward
receives its input from the previous stage and sends its output on; a backward receives
the output's gradient from the next stage and sends the input's gradient back.

GPipe sends as soon as it has computed: its traffic flows one way at a time, and so do
1F1B's warm-up and cool-down. In 1F1B's steady state a stage sends activations forward
while its neighbour sends gradients back; as Megatron does, each send there is paired with
the next receive from the same peer, an exchange whose order is the ``p2p_order`` knob:

* ``send-first``: send, then receive. In 1F1B's steady state neighbours exchange with each
  other at the same time (activations one way, gradients the other), both block in send,
  and on gloo that deadlocks for any tensor size.
* ``even-odd``: even ranks send first, odd ranks receive first, so every pair meets.
* ``batched``: isend and irecv together, then wait for both.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from distdoctor.models import P2POrder, StageEvent
from distdoctor.pipeline.orders import build


class Exchanger:
    """Point-to-point between neighbouring stages, ordered per the knob."""

    def __init__(self, rank: int, order: P2POrder):
        self.rank = rank
        self.order = order

    def run(self, send: tuple[torch.Tensor, int] | None,
            recv: tuple[tuple[int, ...], int] | None) -> torch.Tensor | None:
        buffer = torch.empty(recv[0]) if recv else None
        if send is not None and recv is not None and buffer is not None \
                and send[1] == recv[1] and self.order == "batched":
            ops = [dist.P2POp(dist.isend, send[0], send[1]),
                   dist.P2POp(dist.irecv, buffer, recv[1])]
            for work in dist.batch_isend_irecv(ops) or ():
                work.wait()
        elif send is not None and recv is not None and buffer is not None \
                and send[1] == recv[1] and self.order == "even-odd" and self.rank % 2:
            dist.recv(buffer, src=recv[1])
            dist.send(send[0], dst=send[1])
        else:  # send first: fine when the peers differ (the chain drains from its end)
            if send is not None:
                dist.send(send[0], dst=send[1])
            if recv is not None and buffer is not None:
                dist.recv(buffer, src=recv[1])
        return buffer


def run_step(schedule: str, stage: nn.Module, rank: int, world: int, step: int,
             inputs: list[torch.Tensor], targets: list[torch.Tensor],
             loss_fn: Callable, order: P2POrder, record: Callable[[StageEvent], None]
             ) -> float | None:
    """One optimiser step's forwards and backwards on this rank's stage; the summed
    micro-batch losses (each scaled by 1/M) on the last stage, else None."""
    micro = len(inputs)
    first, last = rank == 0, rank == world - 1
    shape = tuple(inputs[0].shape)
    p2p = Exchanger(rank, order)
    pending: tuple[torch.Tensor, int] | None = None
    saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    total = 0.0
    actions = build(schedule, world, micro).orders[rank]
    steady = _steady(schedule, world, micro, rank)
    for index, action in enumerate(actions):
        m = action.micro
        if pending is not None and not (index - 1 in steady and index in steady):
            p2p.run(pending, None)  # only steady-state neighbours exchange at once
            pending = None
        if action.kind == "F":
            received = inputs[m] if first else p2p.run(pending, (shape, rank - 1))
            assert received is not None  # a receive always fills its buffer
            x = received
            if first and pending is not None:
                p2p.run(pending, None)
            pending = None
            x.requires_grad_(not first)
            with _timed(record, step, rank, m, "F"):
                out = stage(x)
                out = loss_fn(out, targets[m]) / micro if last else out
            saved[m] = (x, out)
            if last:
                total += out.item()
            else:
                pending = (out.detach(), rank + 1)
        else:
            grad = None if last else p2p.run(pending, (shape, rank + 1))
            if last and pending is not None:
                p2p.run(pending, None)
            pending = None
            x, out = saved.pop(m)
            with _timed(record, step, rank, m, "B"):
                out.backward(grad)
            if not first:  # a stage whose output ignores its input still owes a gradient
                pending = (x.grad if x.grad is not None else torch.zeros_like(x), rank - 1)
    if pending is not None:
        p2p.run(pending, None)
    return total if last else None


def _steady(schedule: str, world: int, micro: int, rank: int) -> range:
    """Positions of 1F1B's steady phase in the rank's action list (none for GPipe)."""
    if schedule != "1f1b":
        return range(0)
    warmup = min(world - rank - 1, micro)
    return range(warmup, warmup + 2 * (micro - warmup))


class _timed:
    def __init__(self, record, step: int, stage: int, micro: int, kind: str):
        self.args = (record, step, stage, micro, kind)

    def __enter__(self):
        self.start, self.cpu = time.monotonic(), time.thread_time()

    def __exit__(self, *exc):
        record, step, stage, micro, kind = self.args
        if exc[0] is None:
            record(StageEvent(step, stage, micro, kind, self.start, time.monotonic(),
                              time.thread_time() - self.cpu))
