"""Flat, padded shards: how ZeRO lays one layer's parameters out across N ranks.

A layer is a module that owns parameters itself. Its parameters, flattened and joined,
make one buffer padded with zeros to a multiple of N; rank r owns the r-th of N equal
slices. Per-layer buffers (rather than one for the whole model) let ZeRO-3 gather exactly
the layer it is about to run, as DeepSpeed and FSDP do; the cost is at most N - 1 padding
elements per layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class Layer:
    """One layer's place in the flat layout on one rank."""

    path: str  # the module's path in the model ("fc1")
    names: tuple[str, ...]  # its parameters' names in the model ("fc1.weight", ...)
    shapes: tuple[torch.Size, ...]
    world_size: int
    rank: int

    @property
    def numel(self) -> int:
        return sum(math.prod(shape) for shape in self.shapes)

    @property
    def padded(self) -> int:
        return math.ceil(self.numel / self.world_size) * self.world_size

    @property
    def shard_numel(self) -> int:
        return self.padded // self.world_size

    @property
    def own(self) -> slice:
        return slice(self.rank * self.shard_numel, (self.rank + 1) * self.shard_numel)

    def flatten(self, tensors: Sequence[torch.Tensor | None]) -> torch.Tensor:
        """One padded flat buffer from the layer's tensors (zeros for a missing one)."""
        flat = torch.zeros(self.padded)
        for view, tensor in zip(self.views(flat), tensors):
            if tensor is not None:
                view.copy_(tensor.detach())
        return flat

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's view into a flat buffer of this layer."""
        views, offset = [], 0
        for shape in self.shapes:
            n = math.prod(shape)
            views.append(flat[offset: offset + n].view(shape))
            offset += n
        return views

    def gather(self, shard: torch.Tensor) -> torch.Tensor:
        """The full flat buffer, all-gathered from every rank's shard."""
        full = torch.empty(self.padded, dtype=shard.dtype)
        dist.all_gather_into_tensor(full, shard.detach().contiguous())
        return full


def gather_views(layers: list[Layer], shards: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every parameter of ``layers`` in full, from this rank's shard of each, in one
    all-gather (a gather per layer costs milliseconds each on gloo, and the evidence asks
    for every layer at once). Rank r's part of the joined shards holds its slice of each
    layer, so each layer's flat buffer is its column block of the gathered rows."""
    joined = torch.cat([shard.detach().reshape(-1) for shard in shards])
    n = layers[0].world_size
    rows = torch.empty(n * joined.numel(), dtype=joined.dtype)
    dist.all_gather_into_tensor(rows, joined)
    rows = rows.view(n, -1)
    views, offset = [], 0
    for layer in layers:
        full = rows[:, offset:offset + layer.shard_numel].reshape(-1)
        views.extend(layer.views(full))
        offset += layer.shard_numel
    return views


def layers_of(model: nn.Module, world_size: int, rank: int) -> list[tuple[Layer, nn.Module]]:
    """Every module that owns parameters, in the model's parameter order."""
    found = []
    for path, module in model.named_modules():
        own = list(module.named_parameters(recurse=False))
        if own:
            prefix = f"{path}." if path else ""
            found.append((Layer(path, tuple(prefix + n for n, _ in own),
                                tuple(p.shape for _, p in own), world_size, rank), module))
    return found

