"""A rank-conditional collective at 4 to 16 ranks, as a user's tests would hit it: rank 0
makes an extra all-reduce of 1 element (a metric) that gloo pairs with the others' next
all-reduce of 4, lets rank 0 through, and every rank then blocks at the same line."""

import pytest
import torch
import torch.distributed as dist

from distdoctor.testing import RankFailure


def rank_zero_logs():
    t = torch.ones(4)
    for step in range(3):
        dist.all_reduce(t)  # LINE: loop
        if dist.get_rank() == 0 and step == 1:
            dist.all_reduce(torch.ones(1))  # LINE: extra


@pytest.mark.world_size([4, 8])
def test_rank_zero_logs(rank):  # no world_size argument: each size must still be its own
    rank_zero_logs()


@pytest.mark.world_size(16)
def test_rank_zero_logs_at_16(rank):
    rank_zero_logs()


def test_ranks_run_names_the_odd_rank(ranks):
    with pytest.raises(RankFailure) as failure:
        ranks(16).run(rank_zero_logs)
    assert (failure.value.kind, failure.value.ranks) == ("collective-mismatch", (0,))
