"""ZeRO-1/2's buckets: how layers are grouped, and that one packed reduce-scatter and one
packed all-gather give every rank exactly what per-layer collectives would, checked against
sums worked out here on ragged layer sizes."""

from __future__ import annotations

import math

import pytest
import torch

from distdoctor.training.strategies.zero.bucket import Bucket, buckets_of
from distdoctor.training.strategies.zero.layout import Layer

pytestmark = pytest.mark.tier("unit")

SIZES = [7, 1, 12, 5]  # layer sizes none of the world sizes divides evenly


def layer(numel: int, world_size: int, rank: int) -> Layer:
    return Layer(f"l{numel}", (f"l{numel}.w",), (torch.Size([numel]),), world_size, rank)


def local_flat(numel: int, world_size: int, rank: int, index: int) -> torch.Tensor:
    """Integer-valued, so float sums are exact; zero padding as the layout pads."""
    flat = torch.zeros(math.ceil(numel / world_size) * world_size)
    flat[:numel] = torch.arange(numel) + 100 * rank + 1000 * index
    return flat


def test_layers_are_bucketed_last_first_up_to_the_cap():
    layers = [layer(n, 2, 0) for n in SIZES]  # padded 8, 2, 12, 6 floats
    assert [b.indices for b in buckets_of(layers, cap_bytes=4 * 20)] == [(3, 2, 1), (0,)]
    assert [b.indices for b in buckets_of(layers, cap_bytes=4 * 19)] == [(3, 2), (1, 0)]
    assert [b.indices for b in buckets_of(layers)] == [(3, 2, 1, 0)]
    # a layer over the cap gets a bucket of its own
    assert [b.indices for b in buckets_of(layers, cap_bytes=4 * 4)] == [(3,), (2,), (1,), (0,)]


@pytest.mark.timeout(60)
@pytest.mark.world_size([2, 3, 4], deadline=30)
@pytest.mark.parametrize("cap_bytes", [4, 4 * 14, 2**20])  # one bucket per layer .. all in one
def test_a_bucket_reduce_scatters_and_all_gathers_each_layer_shard_exactly(
        rank, world_size, cap_bytes):
    layers = [layer(k, world_size, rank) for k in SIZES]
    for bucket in buckets_of(layers, cap_bytes):
        flats = [local_flat(SIZES[i], world_size, rank, i) for i in bucket.indices]
        for index, piece in zip(bucket.indices, bucket.split(bucket.reduce_scatter(flats))):
            total = sum(local_flat(SIZES[index], world_size, r, index)
                        for r in range(world_size))
            shard = math.ceil(SIZES[index] / world_size)
            assert piece.tolist() == total[rank * shard:(rank + 1) * shard].tolist()
        params = [torch.full((layers[i].padded,), -1.0) for i in bucket.indices]
        for index, flat in zip(bucket.indices, params):
            flat[layers[index].own] = local_flat(SIZES[index], world_size, 0, index)[
                layers[index].own]
        bucket.all_gather(params)
        for index, flat in zip(bucket.indices, params):
            assert flat.tolist() == local_flat(SIZES[index], world_size, 0, index).tolist()


def test_packing_puts_each_rank_s_shards_of_every_layer_together():
    layers = (layer(3, 2, 0), layer(4, 2, 0))  # padded 4 and 4: shards of 2 and 2
    bucket = Bucket((0, 1), layers)
    packed = bucket.pack([torch.tensor([1., 2, 3, 0]), torch.tensor([5., 6, 7, 8])])
    assert packed.tolist() == [1, 2, 5, 6, 3, 0, 7, 8]
    assert [t.tolist() for t in bucket.split(torch.tensor([1., 2, 5, 6]))] == [[1, 2], [5, 6]]
