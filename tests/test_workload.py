"""The sampler and data set, checked against set arithmetic rather than their own code."""

from __future__ import annotations

import pytest
import torch

from distdoctor.analysis.distance import max_abs_diff, spread
from distdoctor.models import Knobs, RunSpec
from distdoctor.training.fingerprint import fingerprint
from distdoctor.training.workload import batch_ids, make_dataset

pytestmark = pytest.mark.tier("unit")


def epoch_ids(spec: RunSpec, rank: int, epoch: int) -> list[int]:
    first = epoch * spec.steps_per_epoch + 1
    return [i for s in range(first, first + spec.steps_per_epoch) for i in batch_ids(spec, rank, s)]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_an_epoch_deals_disjoint_shares_that_cover_the_used_samples(world_size):
    spec = RunSpec(world_size=world_size, num_samples=70, batch_size=4, num_steps=9)
    for epoch in range(3):
        shares = [epoch_ids(spec, r, epoch) for r in range(world_size)]
        seen = [i for share in shares for i in share]
        assert len(seen) == len(set(seen)) == spec.steps_per_epoch * world_size * 4
        assert set(seen) <= set(range(70))
        assert all(len(share) == spec.steps_per_epoch * 4 for share in shares)


def test_each_epoch_is_reshuffled_unless_the_epoch_is_never_set():
    spec = RunSpec(world_size=2, num_samples=64, batch_size=8)
    orders = [epoch_ids(spec, 0, e) for e in range(3)]
    assert len({tuple(order) for order in orders}) == 3  # each epoch unlike every other
    frozen = RunSpec(world_size=2, num_samples=64, batch_size=8,
                     knobs=Knobs(sampler_set_epoch=False))
    assert epoch_ids(frozen, 0, 0) == epoch_ids(frozen, 0, 1) == epoch_ids(frozen, 0, 2)


def test_a_shared_seed_gives_every_rank_the_same_batches():
    spec = RunSpec(world_size=4, num_samples=64, batch_size=8, knobs=Knobs(sampler="shared-seed"))
    assert len({tuple(batch_ids(spec, r, 1)) for r in range(4)}) == 1


def test_the_data_set_is_the_same_everywhere_and_depends_on_the_seed():
    a, b = make_dataset(RunSpec(seed=3)), make_dataset(RunSpec(seed=3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], make_dataset(RunSpec(seed=4))[0])


def test_fingerprints_measure_exact_differences():
    base = [torch.arange(6.0).reshape(2, 3), torch.ones(2)]
    moved = [base[0].clone(), base[1] + torch.tensor([0.0, 0.25])]
    a, b = fingerprint(base, 512), fingerprint(moved, 512)
    assert a.numel == 8 and a.values == tuple(float(v) for v in [0, 1, 2, 3, 4, 5, 1, 1])
    assert max_abs_diff(a, b) == 0.25 and spread([a, a, b]) == 0.25 and spread([a, a]) == 0.0
    sampled = fingerprint([torch.arange(1000.0)], 10)
    assert len(sampled.values) == 10 and sampled.values[0] == 0.0 and sampled.values[-1] == 999.0
