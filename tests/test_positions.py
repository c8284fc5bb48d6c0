"""Sample positions spread over a tensor (analysis/positions.py): exact in integers at any
size, where float32's linspace ran past the end above 2**24 values."""

from __future__ import annotations

import pytest
import torch

from distdoctor.analysis.positions import spread_positions

pytestmark = pytest.mark.tier("unit")


def test_positions_end_at_the_last_value_at_any_size():
    for numel in (1, 2, 5, 64, 2**24 + 1, 307_200_000, 205_852_672):
        at = spread_positions(numel, 32)
        assert at[0] == 0 and at[-1] == numel - 1 and len(at) == min(32, numel)
        assert at == sorted(set(at))
    # float32's linspace, as every sampler used it, ends past a 307,200,000-value tensor
    assert int(torch.linspace(0, 307_200_000 - 1, 32).round().long()[-1]) == 307_200_000


def test_small_sizes_keep_the_positions_they_had():
    for numel, count in ((10, 4), (100, 7), (9, 9), (3, 8), (1000, 32)):
        before = torch.linspace(0, numel - 1, min(count, numel)).round().long().tolist()
        assert spread_positions(numel, count) == before
    assert spread_positions(0, 4) == []
