"""assert_same_on_all_ranks: what it flattens, what it calls a difference, and its message,
on hand-made per-rank entries and on real ranks through the plugin."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from distdoctor.testing import assert_same_on_all_ranks
from distdoctor.testing.same import differences, flatten

pytestmark = pytest.mark.tier("unit")


def test_a_module_flattens_to_its_parameters_and_buffers():
    model = nn.BatchNorm1d(3)
    assert list(flatten(model)) == ["param weight", "param bias", "buffer running_mean",
                                    "buffer running_var", "buffer num_batches_tracked"]


def test_an_optimiser_flattens_to_its_state_and_groups():
    model = nn.Linear(2, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.5)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    entries = flatten(optimizer)
    assert torch.equal(entries["state.0.exp_avg"], optimizer.state[model.weight]["exp_avg"])
    assert entries["param_groups[0].lr"] == 0.5


def test_each_kind_of_difference_is_named_against_the_lowest_rank():
    base = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor([1, 2]), "lr": 0.1,
            "gone": torch.zeros(1), "nan": torch.tensor([float("nan")])}
    other = {"w": torch.tensor([1.0, 2.5]), "n": torch.tensor([1, 3]), "lr": 0.2,
             "extra": 1, "nan": torch.tensor([0.0])}
    found = {d.entry: (d.ranks, d.against, d.detail)
             for d in differences({0: base, 1: base, 2: other}, atol=0.0, rtol=0.0)}
    assert found == {
        "w": ((2,), 0, "max abs difference 0.5 at (1,) (2.5 vs 2), "
                       "1 of 2 elements over the tolerance"),
        "n": ((2,), 0, "1 of 2 elements differ, first at (1,)"),
        "lr": ((2,), 0, "0.2 vs 0.1"),
        "gone": ((2,), 0, "missing"),
        "extra": ((2,), 0, "present only there"),
        "nan": ((2,), 0, "max abs difference nan at (0,) (0 vs nan), "
                         "1 of 1 elements over the tolerance")}


def test_a_gap_within_the_tolerance_is_no_difference():
    a, b = {"w": torch.tensor([100.0])}, {"w": torch.tensor([100.5])}
    assert differences({0: a, 1: b}, atol=0.0, rtol=0.01) == []
    assert differences({0: a, 1: b}, atol=0.4, rtol=0.0) != []
    assert differences({0: a, 1: {"w": torch.tensor([100.0, 0.0])}}, 0, 0)[0].detail == \
        "shape (2,) torch.float32 vs (1,) torch.float32"


@pytest.mark.world_size(3)
def test_on_ranks_every_rank_raises_the_same_message(rank):
    value = torch.tensor([1.0, 2.0 + (rank == 2) * 0.25])
    with pytest.raises(AssertionError) as failure:
        assert_same_on_all_ranks({"w": value, "step": 3})
    assert str(failure.value) == (
        "the dict differs across ranks 0, 1, 2 (1 of 2 entries):\n"
        "  w: rank 2 vs rank 0: max abs difference 0.25 at (1,) (2.25 vs 2), "
        "1 of 2 elements over the tolerance")
    assert_same_on_all_ranks({"w": value, "step": 3}, atol=0.25)
