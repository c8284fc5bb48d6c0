"""Multi-head self-attention cut by heads, Megatron's way: q, k and v column-parallel (each
rank computes its heads' projections whole), the scores and softmax of those heads on that
rank alone, and the output projection row-parallel (each rank's heads' share of it, summed
once). One all-reduce forward (the block's output, batch x seq x d), and one backward (the
gradient of the input the three projections read, summed once for all three)."""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import nn

from distdoctor.tensor.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    TrafficLog,
    copy_to_group,
    local_copy,
)


class MultiHeadAttention(nn.Module):
    """The whole block, residual included. The heads are read off the projections' width
    (``head_dim`` fixed), so the same forward serves a rank holding some of the heads (as
    torch's ColwiseParallel leaves q, k and v)."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        if d % heads:
            raise ValueError(f"{heads} heads do not split a width of {d}")
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.head_dim = d // heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.o(attend(self.q(x), self.k(x), self.v(x), self.head_dim))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Softmax attention per head over (batch, seq, heads x head_dim) projections."""
    batch, seq, width = q.shape

    def heads(t):
        return t.reshape(batch, seq, width // head_dim, head_dim).transpose(1, 2)

    scores = heads(q) @ heads(k).transpose(-2, -1) / math.sqrt(head_dim)
    out = torch.softmax(scores, dim=-1) @ heads(v)
    return out.transpose(1, 2).reshape(batch, seq, width)


class TensorParallelAttention(nn.Module):
    """This rank's heads of ``full`` (heads split evenly: ranks take consecutive heads)."""

    def __init__(self, full: MultiHeadAttention, rank: int, size: int, group=None):
        super().__init__()
        heads = full.q.out_features // full.head_dim
        if heads % size:
            raise ValueError(f"{heads} heads do not split over {size} tensor-parallel ranks")
        self.log = TrafficLog()
        self.q, self.k, self.v = (ColumnParallelLinear(layer, rank, size, self.log, group,
                                                       copy_input=False)
                                  for layer in (full.q, full.k, full.v))
        self.o = RowParallelLinear(full.o, rank, size, self.log, group)
        self.head_dim, self.group = full.head_dim, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = copy_to_group(x, self.log, self.group)
        return x + self.o(attend(self.q(shared), self.k(shared), self.v(shared), self.head_dim))


def attention_steps(ctx, kind: str, d: int, heads: int, steps: int, seed: int = 0) -> dict:
    """A few SGD steps of one attention block on a rank, every rank on the same batches:
    the parameters after them and the first step's gradients as this rank holds them,
    and the all-reduces the layers issued in the first step ("tp": written out here;
    "torch-tp": parallelize_module, q/k/v ColwiseParallel and o RowwiseParallel)."""
    torch.manual_seed(seed)
    full = MultiHeadAttention(d, heads)
    if kind == "tp":
        model = TensorParallelAttention(full, ctx.rank, ctx.world_size)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        mesh = init_device_mesh("cpu", (ctx.world_size,))
        model = cast(TensorParallelAttention, parallelize_module(
            full, mesh, {"q": ColwiseParallel(), "k": ColwiseParallel(),
                         "v": ColwiseParallel(), "o": RowwiseParallel()}))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = attention_data(d, steps, seed)
    grads, traffic = {}, None
    for step, (x, y) in enumerate(data):
        optimizer.zero_grad()
        (model(x.requires_grad_(True)) - y).pow(2).mean().backward()
        if step == 0:
            grads = {n: local_copy(p.grad) for n, p in model.named_parameters()
                     if p.grad is not None}
            log = getattr(model, "log", None)
            traffic = log and {"calls": dict(log.calls), "bytes": dict(log.bytes)}
        optimizer.step()
    return {"params": {n: local_copy(p) for n, p in model.named_parameters()}, "grads": grads,
            "traffic": traffic}


def attention_data(d: int, steps: int, seed: int = 0, batch: int = 2, seq: int = 6):
    gen = torch.Generator().manual_seed(30_000 + seed)
    return [(torch.randn(batch, seq, d, generator=gen), torch.randn(batch, seq, d, generator=gen))
            for _ in range(steps)]
