"""Buckets: several layers synchronised by one collective, their shards kept per layer.

A collective's latency, not its bytes, dominates small layers (measured with gloo on this
machine: four back-to-back reduce-scatters of 514 floats on 2 ranks take 3.9 ms, one
takes 0.35 ms), so ZeRO-1 and ZeRO-2 reduce-scatter and all-gather whole buckets, as
DeepSpeed's reduce buckets and DDP's do. The layout does not change: each layer stays
one padded flat buffer sharded N ways. A bucket packs its layers rank-major, so rank r's
part of the packed buffer is the concatenation of rank r's shard of every layer and one
reduce-scatter hands each rank exactly its own shards; an all-gather of the concatenated
own shards unpacks the same way. The packed copy (fp32, like the layout) lives for one
collective only; it is the price of bucketing: a bucket's worth of gradient held twice
while it is reduced, which BUCKET_BYTES caps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
import torch.distributed as dist

from distdoctor.training.strategies.zero.layout import Layer

BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb


@dataclass(frozen=True)
class Bucket:
    """Consecutive layers (by index in the model's layer list) synchronised together."""

    indices: tuple[int, ...]
    layers: tuple[Layer, ...]

    @property
    def world_size(self) -> int:
        return self.layers[0].world_size

    @property
    def shard_numel(self) -> int:
        return sum(layer.shard_numel for layer in self.layers)

    def _columns(self):
        offset = 0
        for layer in self.layers:
            yield layer, slice(offset, offset + layer.shard_numel)
            offset += layer.shard_numel

    def pack(self, flats: Iterable[torch.Tensor]) -> torch.Tensor:
        """The layers' full flat buffers, rank-major: row r holds every layer's shard r.
        ``flats`` is read one layer at a time, so a generator can free each as it goes."""
        packed = torch.empty(self.world_size, self.shard_numel)
        for (layer, columns), flat in zip(self._columns(), flats):
            packed[:, columns].copy_(flat.view(self.world_size, layer.shard_numel))
        return packed.view(-1)

    def split(self, shard: torch.Tensor) -> list[torch.Tensor]:
        """This rank's part of a packed buffer, as one view per layer."""
        return [shard[columns] for _, columns in self._columns()]

    def reduce_scatter(self, flats: Iterable[torch.Tensor]) -> torch.Tensor:
        """The sum over ranks of this rank's shard of every layer, concatenated."""
        packed = self.pack(flats)
        shard = torch.empty(self.shard_numel)
        dist.reduce_scatter_tensor(shard, packed, op=dist.ReduceOp.SUM)
        return shard

    def all_gather(self, flats: list[torch.Tensor]) -> None:
        """Every rank's own shards into every layer's flat buffer, in place."""
        own = torch.cat([flat[layer.own] for layer, flat in zip(self.layers, flats)])
        packed = torch.empty(self.world_size, self.shard_numel, dtype=own.dtype)
        dist.all_gather_into_tensor(packed.view(-1), own)
        for (layer, columns), flat in zip(self._columns(), flats):
            flat.view(self.world_size, layer.shard_numel).copy_(packed[:, columns])


def buckets_of(layers: list[Layer], cap_bytes: int = BUCKET_BYTES) -> list[Bucket]:
    """Layers in the order backward finishes them (last first), cut into buckets of at most
    ``cap_bytes`` of fp32 padded parameters (a larger layer gets a bucket of its own)."""
    buckets: list[list[int]] = []
    indices: list[int] = []
    size = 0
    for index in reversed(range(len(layers))):
        nbytes = 4 * layers[index].padded
        if indices and size + nbytes > cap_bytes:
            buckets.append(indices)
            indices, size = [], 0
        indices.append(index)
        size += nbytes
    if indices:
        buckets.append(indices)
    return [Bucket(tuple(b), tuple(layers[i] for i in b)) for b in buckets]
