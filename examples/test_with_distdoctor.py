"""Tests of your own distributed code with distdoctor's pytest plugin: a complete file.

    pytest examples/test_with_distdoctor.py   # with distdoctor installed (make does it)

The plugin is installed with distdoctor (a pytest11 entry point); -p no:distdoctor turns
it off.

Each test marked world_size runs on that many real gloo ranks of a warm pool, with the
default process group initialised, as under torchrun. tests/test_pytest_plugin.py runs
this file and expects every test to pass.
"""

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from distdoctor.testing import assert_same_on_all_ranks, assert_trains_like_one_process


# 1. The body runs on every rank; `rank` and `world_size` are per rank.
@pytest.mark.world_size([2, 4])  # one test per size: test_all_reduce_sums[world_size=2], ...
def test_all_reduce_sums(rank, world_size):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    assert t.item() == sum(range(world_size))


# 2. Other fixtures are built once, in the parent, and sent to the ranks by value.
@pytest.fixture
def weights():
    return torch.arange(6.0).reshape(2, 3)


@pytest.mark.world_size(2, deadline=60)
@pytest.mark.parametrize("src", [0, 1])
def test_broadcast_reaches_every_rank(rank, weights, src, tmp_path):
    t = weights.clone() if rank == src else torch.zeros(2, 3)
    dist.broadcast(t, src=src)
    assert torch.equal(t, weights)
    (tmp_path / f"rank-{rank}.txt").write_text("done")  # tmp_path is shared by the ranks


# 3. Replicas that must agree: a DDP model and its optimiser after a step.
@pytest.mark.world_size(3)
def test_ddp_replicas_stay_identical(rank):
    torch.manual_seed(rank)  # a different init per rank: DDP broadcasts rank 0's
    model = DDP(nn.Linear(4, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(8, 4) + rank).pow(2).mean().backward()
    optimizer.step()
    assert_same_on_all_ranks(model.module)
    assert_same_on_all_ranks(optimizer)


# 4. Your own training step against the same code on one process, step by step.
def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def train_step(model, optimizer, batch):
    """A hand-written data-parallel step: average the gradients over the ranks."""
    x, y = batch
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    optimizer.step()


def test_hand_written_data_parallel_trains_like_one_process():
    data = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 4, generator=data), torch.randn(8, 1, generator=data))
               for _ in range(4)]
    assert_trains_like_one_process(build, train_step, batches, world_size=4)


# 5. A property over many inputs: hypothesis draws in the parent, the ranks run each one.
def gather_lengths(lengths):
    mine = torch.zeros(lengths[dist.get_rank()])
    sizes = [None] * dist.get_world_size()
    dist.all_gather_object(sizes, mine.numel())
    return sizes


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=3, max_size=3))
def test_every_rank_learns_every_length(ranks, lengths):
    assert ranks(3).run(gather_lengths, lengths) == [lengths] * 3
