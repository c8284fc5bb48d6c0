"""Rank-side jobs: run one collective (ours, gloo's own, or a user's) on every rank."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any, Callable

import torch
import torch.distributed as dist

from distdoctor.collectives import USER_API, algorithms
from distdoctor.collectives.rendezvous import RendezvousTransport
from distdoctor.collectives.transport import GlooTransport, QueueTransport
from distdoctor.models.events import Emit

# name -> (function, takes an op, takes a source rank)
OURS: dict[str, tuple[Callable, bool, bool]] = {
    "ring-allreduce": (algorithms.ring_allreduce, True, False),
    "tree-allreduce": (algorithms.tree_allreduce, True, False),
    "broadcast": (algorithms.broadcast, False, True),
    "allgather": (algorithms.all_gather, False, False),
    "reduce-scatter": (algorithms.reduce_scatter, True, False),
}
_REDUCE = {"sum": "SUM", "avg": "AVG", "max": "MAX", "min": "MIN", "product": "PRODUCT"}


def transport_for(ctx, kind: str, timeout: float | None = None):
    if kind == "queue":
        if ctx.mesh is None:
            raise ValueError("a queue transport needs a RankPool(mesh=True)")
        return QueueTransport(ctx.rank, ctx.world_size, ctx.mesh, timeout)
    if kind == "rendezvous":
        if ctx.mesh is None:
            raise ValueError("a rendezvous transport needs a RankPool(mesh=True)")
        return RendezvousTransport(ctx.rank, ctx.world_size, ctx.mesh, timeout)
    if kind == "gloo":
        return GlooTransport(ctx.rank, ctx.world_size)
    raise ValueError(f"unknown transport {kind!r}")


def run_ours(ctx, kind: str, name: str, inputs: list[torch.Tensor], op: str = "sum",
             src: int = 0, timeout: float | None = None) -> tuple[Any, dict]:
    """This rank's result and its transport's counters."""
    transport = transport_for(ctx, kind, timeout)
    function, takes_op, takes_src = OURS[name]
    extra = {"op": op} if takes_op else {"src": src} if takes_src else {}
    result = function(transport, inputs[ctx.rank], **extra)
    return result, dataclasses.asdict(transport.stats)


def run_native(ctx, name: str, inputs: list[torch.Tensor], op: str = "sum",
               src: int = 0) -> Any:
    """gloo's own collective on the same data."""
    x = inputs[ctx.rank].clone()
    reduce = getattr(dist.ReduceOp, _REDUCE[op])
    if name == "allreduce":
        dist.all_reduce(x, op=reduce)
        return x
    if name == "broadcast":
        dist.broadcast(x, src=src)
        return x
    if name == "allgather":
        gathered = [torch.empty_like(x) for _ in range(ctx.world_size)]
        dist.all_gather(gathered, x)
        return gathered
    if name == "reduce-scatter":
        out = torch.empty(x.numel() // ctx.world_size, dtype=x.dtype)
        dist.reduce_scatter(out, list(x.chunk(ctx.world_size)), op=reduce)
        return out
    raise ValueError(f"unknown native collective {name!r}")


def run_user(ctx, target: str, kind: str, inputs: list[torch.Tensor], src: int,
             timeout: float, wire: str = "buffered") -> Any:
    """A user's ``module:function(transport, tensor[, src])`` on the queue mesh, buffered
    (a send returns at once) or as a rendezvous (a send returns once received)."""
    module, _, name = target.partition(":")
    function = getattr(importlib.import_module(module), name)
    inner = transport_for(ctx, "rendezvous" if wire == "rendezvous" else "queue", timeout)
    inner.on_wait = lambda what, peer: ctx.emit((Emit.WAITING, what, peer))
    transport = _FirstCallNoted(inner, ctx)
    x = inputs[ctx.rank].clone()
    with transport.collective(f"{kind} ({target})"):
        result = function(transport, x, src) if kind == "broadcast" else function(transport, x)
        if wire == "rendezvous":
            inner.settle()  # every isend received, and no answer left for the next job
        return result


class TransportMisuse(TypeError):
    """A user's function called the transport with arguments its methods do not take (a
    torch-style ``recv(buffer, src)``): the same on every example, so reported at once."""


class _FirstCallNoted:
    """A transport that tells the parent when this rank first sends or receives, so a rank
    stopped later can be said to have never entered either (its stack says where it was),
    and that checks each call's arguments against the method's signature first."""

    def __init__(self, transport, ctx):
        self._transport, self._ctx, self._noted = transport, ctx, False

    def __getattr__(self, name: str):
        attribute = getattr(self._transport, name)
        if name not in USER_METHODS:
            return attribute
        if not self._noted:
            self._noted = True
            self._ctx.emit((Emit.TRANSPORT_CALL, name))

        def checked(*args, **kwargs):
            try:
                inspect.signature(attribute).bind(*args, **kwargs)
            except TypeError as exc:
                shown = ", ".join([*map(_shown, args),
                                   *(f"{k}={_shown(v)}" for k, v in kwargs.items())])
                raise TransportMisuse(
                    f"{name}({shown}) does not fit the transport's "
                    f"{USER_METHODS[name]} ({exc})") from None
            return attribute(*args, **kwargs)

        return checked


USER_METHODS = {text.split("(")[0]: text for text, _ in USER_API if "(" in text}


def _shown(value) -> str:
    return f"<tensor {tuple(value.shape)}>" if isinstance(value, torch.Tensor) else repr(value)
