"""Column- and row-parallel linear layers and the two conjugate functions between them.

Column-parallel: each rank holds a slice of the output features, so its input must be the
whole activation, the same on every rank; in backward each rank holds only its slice's
share of the input gradient, which must be summed: identity forward, all-reduce backward
(``copy_to_group``). Row-parallel: each rank holds a slice of the input features and
computes a partial sum of the output, summed across ranks: all-reduce forward, identity
backward (``reduce_from_group``). A column layer followed by a row layer needs no
communication between them, one all-reduce forward and one backward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn


@dataclass
class TrafficLog:
    """All-reduces the tensor-parallel layers issued, and their bytes, by direction."""

    calls: dict[str, int] = field(default_factory=lambda: {"forward": 0, "backward": 0})
    bytes: dict[str, int] = field(default_factory=lambda: {"forward": 0, "backward": 0})

    def all_reduce(self, tensor: torch.Tensor, direction: str, group) -> torch.Tensor:
        if dist.get_world_size(group) > 1:  # one rank holds every slice: nothing to sum
            self.calls[direction] += 1
            self.bytes[direction] += tensor.numel() * tensor.element_size()
            dist.all_reduce(tensor, group=group)
        return tensor


class _CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, log, group):
        ctx.log, ctx.group = log, group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.log.all_reduce(grad.contiguous().clone(), "backward", ctx.group), None, None


class _ReduceFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, log, group):
        return log.all_reduce(x.contiguous().clone(), "forward", group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def copy_to_group(x: torch.Tensor, log: TrafficLog, group=None) -> torch.Tensor:
    return _CopyToGroup.apply(x, log, group)


def reduce_from_group(x: torch.Tensor, log: TrafficLog, group=None) -> torch.Tensor:
    return _ReduceFromGroup.apply(x, log, group)


def _rows(n: int, rank: int, size: int) -> slice:
    if n % size:
        raise ValueError(f"{n} features do not split evenly over {size} tensor-parallel ranks")
    return slice(rank * n // size, (rank + 1) * n // size)


class ColumnParallelLinear(nn.Module):
    """This rank's slice of ``full``'s output features (rows of its weight, and its bias)."""

    def __init__(self, full: nn.Linear, rank: int, size: int, log: TrafficLog, group=None):
        super().__init__()
        part = _rows(full.out_features, rank, size)
        self.weight = nn.Parameter(full.weight.detach()[part].clone())
        self.bias = nn.Parameter(full.bias.detach()[part].clone())
        self.log, self.group = log, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(copy_to_group(x, self.log, self.group), self.weight,
                                    self.bias)


class RowParallelLinear(nn.Module):
    """This rank's slice of ``full``'s input features (columns of its weight); the bias is
    whole on every rank and added once, after the partial sums are summed."""

    def __init__(self, full: nn.Linear, rank: int, size: int, log: TrafficLog, group=None):
        super().__init__()
        part = _rows(full.in_features, rank, size)
        self.weight = nn.Parameter(full.weight.detach()[:, part].clone())
        self.bias = nn.Parameter(full.bias.detach().clone())
        self.log, self.group = log, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = nn.functional.linear(x, self.weight)
        return reduce_from_group(partial, self.log, self.group) + self.bias
