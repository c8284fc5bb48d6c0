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
            self._count(direction, tensor)
            dist.all_reduce(tensor, group=group)
        return tensor

    def _count(self, direction: str, tensor: torch.Tensor) -> None:
        self.calls[direction] += 1
        self.bytes[direction] += tensor.numel() * tensor.element_size()

    def reduce_scatter_rows(self, tensor: torch.Tensor, group) -> torch.Tensor:
        """Sum over the group and keep this rank's 1/size of the rows."""
        size = dist.get_world_size(group)
        if size == 1:
            return tensor
        out = tensor.new_empty((tensor.shape[0] // size, *tensor.shape[1:]))
        self._count("forward", tensor)
        dist.reduce_scatter_tensor(out, tensor.contiguous(), group=group)
        return out

    def all_gather_rows(self, tensor: torch.Tensor, group) -> torch.Tensor:
        size = dist.get_world_size(group)
        if size == 1:
            return tensor
        out = tensor.new_empty((tensor.shape[0] * size, *tensor.shape[1:]))
        self._count("backward", out)
        dist.all_gather_into_tensor(out, tensor.contiguous(), group=group)
        return out


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


class _ReduceScatterRows(torch.autograd.Function):
    """Sequence parallelism's exit from a row-parallel layer: sum the partial outputs and
    keep this rank's rows; backward, every rank's row gradients gathered back."""

    @staticmethod
    def forward(ctx, x, log, group):
        ctx.log, ctx.group = log, group
        return log.reduce_scatter_rows(x, group)

    @staticmethod
    def backward(ctx, grad):
        return ctx.log.all_gather_rows(grad, ctx.group), None, None


def local_copy(t: torch.Tensor) -> torch.Tensor:
    """This rank's own values as a new plain tensor: a DTensor's local part (an async
    collective's result comes out waited for, as any op on it does)."""
    return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()


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

    def __init__(self, full: nn.Linear, rank: int, size: int, log: TrafficLog, group=None,
                 copy_input: bool = True):
        """``copy_input`` False: the caller has passed the input through copy_to_group
        once for several layers that read it (attention's q, k and v), so its gradient is
        summed once, not once per layer."""
        super().__init__()
        part = _rows(full.out_features, rank, size)
        self.weight = nn.Parameter(full.weight.detach()[part].clone())
        self.bias = nn.Parameter(full.bias.detach()[part].clone())
        self.log, self.group, self.copy_input = log, group, copy_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.copy_input:
            x = copy_to_group(x, self.log, self.group)
        return nn.functional.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """This rank's slice of ``full``'s input features (columns of its weight); the bias is
    whole on every rank and added once, after the partial sums are summed.

    ``reduce``: "sum" all-reduces the partial outputs (every rank gets the whole output);
    "rows" reduce-scatters them (sequence parallelism: each rank gets its rows of it);
    "none" leaves each rank its partial sum, the bug a forgotten all-reduce makes."""

    def __init__(self, full: nn.Linear, rank: int, size: int, log: TrafficLog, group=None,
                 reduce: str = "sum"):
        super().__init__()
        part = _rows(full.in_features, rank, size)
        self.weight = nn.Parameter(full.weight.detach()[:, part].clone())
        self.bias = nn.Parameter(full.bias.detach().clone())
        self.log, self.group, self.reduce = log, group, reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = nn.functional.linear(x, self.weight)
        if self.reduce == "rows":
            return _ReduceScatterRows.apply(partial, self.log, self.group) + self.bias
        if self.reduce == "none":
            return partial + self.bias
        return reduce_from_group(partial, self.log, self.group) + self.bias
