"""A user's own distributed tests, written against the plugin's API alone (markers,
fixtures, distdoctor.testing). tests/test_pytest_plugin.py runs this file in a project of its
own and checks every test's outcome and failure text; the line numbers it expects are
found by the LINE markers below."""

import contextlib
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from distdoctor.testing import (
    RankFailure,
    assert_resumes_like_uninterrupted,
    assert_same_on_all_ranks,
    assert_trains_like_one_process,
)


@pytest.mark.world_size(4)
def test_all_reduce_sums(rank, world_size):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    assert t.item() == world_size * (world_size + 1) / 2


@pytest.mark.world_size([2, 3])
def test_broadcast_from_zero(rank, world_size, tmp_path):
    t = torch.tensor([42.0 if rank == 0 else 0.0])
    dist.broadcast(t, src=0)
    assert t.item() == 42.0
    (tmp_path / f"rank-{rank}").write_text(str(world_size))


@pytest.mark.world_size(2)
@pytest.mark.parametrize("length", [1, 5])
def test_all_gather(rank, length):
    out = [torch.zeros(length) for _ in range(2)]
    dist.all_gather(out, torch.full((length,), float(rank)))
    assert [o.tolist() for o in out] == [[0.0] * length, [1.0] * length]


@pytest.mark.world_size(2)
def test_one_rank_wrong(rank):
    t = torch.tensor([float(rank)])
    dist.broadcast(t, src=0)
    assert t.item() == rank  # LINE one_rank_wrong


@pytest.mark.world_size(2)
def test_send_send(rank):
    t = torch.zeros(4)
    dist.send(t, dst=1 - rank)  # LINE send_send
    dist.recv(t, src=1 - rank)


@pytest.mark.world_size(3)
def test_rank_returns_early(rank):
    if rank == 2:
        return
    dist.barrier()  # LINE barrier


@pytest.mark.world_size(2)
def test_collectives_differ(rank):
    t = torch.zeros(4)
    if rank == 0:
        dist.all_reduce(t)  # LINE all_reduce
    else:
        dist.broadcast(t, src=0)  # LINE broadcast


@pytest.mark.world_size(3)
def test_rank_exits(rank):
    if rank == 2:
        os._exit(7)
    dist.barrier()


@pytest.mark.world_size(2)
def test_rank_killed(rank):
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


@pytest.mark.world_size(2)
def test_one_rank_slow(rank):
    """Passes: but rank 1 makes rank 0 wait 20 ms at every all-reduce."""
    for _ in range(40):
        if rank == 1:
            time.sleep(0.02)  # LINE slow_rank
        dist.all_reduce(torch.ones(4))


@pytest.mark.world_size(2)
def test_runs_after_failures(rank):
    t = torch.ones(3)
    dist.all_reduce(t)
    assert t.tolist() == [2.0, 2.0, 2.0]


@pytest.mark.world_size(2)
def test_skips_inside(rank):
    pytest.skip("needs a GPU per rank")


@pytest.mark.skipif(True, reason="skipped before any rank runs")
@pytest.mark.world_size(2)
def test_skipif(rank):
    raise AssertionError("never runs")


@pytest.mark.xfail(reason="rank 1 is known to disagree", strict=True)
@pytest.mark.world_size(2)
def test_xfail(rank):
    assert rank == 0


def total(values):
    t = torch.tensor(values[dist.get_rank()], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item()


def total_below_fifty(x):
    t = torch.tensor(float(x))
    dist.all_reduce(t)
    assert t.item() < 50, "the sum reached fifty"  # LINE below_fifty
    return t.item()


@settings(max_examples=25, deadline=None, database=None)
@given(st.lists(st.integers(-1000, 1000), min_size=3, max_size=3))
def test_sum_property(ranks, values):
    assert ranks(3).run(total, values) == [float(sum(values))] * 3


@settings(max_examples=50, deadline=None, database=None)
@given(st.integers(0, 100))
def test_property_shrinks(ranks, x):
    ranks(2).run(total_below_fifty, x)


def test_rank_failure_carries_its_cause(ranks):
    with pytest.raises(RankFailure) as failure:
        ranks(2).run(total_below_fifty, 30)
    assert failure.value.kind == "failed"
    assert "the sum reached fifty" in failure.value.text


@pytest.mark.world_size(2)
def test_replicas_agree(rank):
    torch.manual_seed(0)
    model = DDP(nn.Linear(3, 2))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3) + rank).sum().backward()
    optimizer.step()
    assert_same_on_all_ranks(model.module)
    assert_same_on_all_ranks(optimizer)


@pytest.mark.world_size(3)
def test_replicas_differ(rank):
    torch.manual_seed(0 if rank == 0 else 1)
    assert_same_on_all_ranks(nn.Linear(3, 2))


def build_ddp():
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def build_seeded_by_rank():
    torch.manual_seed(dist.get_rank())
    model = nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def build_plain():
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 1), nn.Linear(4, 1)

    def forward(self, x):
        return self.a(x) if dist.get_rank() == 0 else self.a(x) + self.b(x)


def build_branchy():
    torch.manual_seed(0)
    model = DDP(Branchy())
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()  # LINE step
    optimizer.step()


def step_summing(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)  # LINE summing
    optimizer.step()


def step_averaging(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    optimizer.step()


_data = torch.Generator().manual_seed(1)
BATCHES = [(torch.randn(8, 4, generator=_data), torch.randn(8, 1, generator=_data))
           for _ in range(3)]


def test_ddp_trains_like_one_process():
    assert_trains_like_one_process(build_ddp, step, BATCHES, world_size=2)


def test_hand_averaging_trains_like_one_process():
    assert_trains_like_one_process(build_plain, step_averaging, BATCHES, world_size=4)


def test_summed_gradients():
    assert_trains_like_one_process(build_plain, step_summing, BATCHES, world_size=2)


def test_seeded_by_rank():
    assert_trains_like_one_process(build_seeded_by_rank, step_averaging, BATCHES, world_size=2)


def test_unused_parameters():
    assert_trains_like_one_process(build_branchy, step, BATCHES, world_size=2)


# -- replicas that part silently: the update, or the state, differs by rank ------------

def build_momentum_resumed_on_rank_zero():
    torch.manual_seed(0)
    net = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    if dist.get_rank() == 0:  # a checkpoint's momentum, loaded on rank 0 alone
        saved = optimizer.state_dict()
        saved["state"] = {i: {"momentum_buffer": torch.full_like(p, 0.5)}
                          for i, p in enumerate(net.parameters())}
        optimizer.load_state_dict(saved)  # LINE loaded
    return DDP(net), optimizer


def build_scheduled():
    model, optimizer = build_ddp()
    optimizer.schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    return model, optimizer


def step_clipping_on_rank_zero(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x), y * 10).backward()
    if dist.get_rank() == 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)  # LINE clipped
    optimizer.step()


def step_scheduling_on_rank_zero(model, optimizer, batch):
    step(model, optimizer, batch)
    if dist.get_rank() == 0:
        optimizer.schedule.step()  # LINE scheduled


def step_syncing_the_first_micro_batch(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad()
    for micro in range(2):  # the sync belongs to the last micro-batch, not the first
        half = slice(micro * len(x) // 2, (micro + 1) * len(x) // 2)
        with model.no_sync() if micro > 0 else contextlib.nullcontext():
            nn.functional.mse_loss(model(x[half]), y[half]).div(2).backward()  # LINE micro
    optimizer.step()


def test_clipped_on_rank_zero():
    assert_trains_like_one_process(build_ddp, step_clipping_on_rank_zero, BATCHES, world_size=2)


def test_scheduled_on_rank_zero():
    assert_trains_like_one_process(build_scheduled, step_scheduling_on_rank_zero, BATCHES,
                                   world_size=2)


def test_momentum_resumed_on_rank_zero():
    assert_trains_like_one_process(build_momentum_resumed_on_rank_zero, step, BATCHES,
                                   world_size=2)


def test_synced_on_the_first_micro_batch():
    assert_trains_like_one_process(build_ddp, step_syncing_the_first_micro_batch, BATCHES,
                                   world_size=2)


def build_batch_norm_kept_per_rank():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
    model = DDP(net, broadcast_buffers=False)  # LINE buffers
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_batch_norm_kept_per_rank():
    assert_trains_like_one_process(build_batch_norm_kept_per_rank, step, BATCHES,
                                   world_size=2)


# -- a checkpoint and its resume, against the training never stopped ------------------

def build_dropout():
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 1)))
    torch.manual_seed(100 + dist.get_rank())  # each rank's own dropout masks
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def save_every_rank(model, optimizer, folder):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "rng": torch.get_rng_state()}, f"{folder}/rank{dist.get_rank()}.pt")


def load_every_rank(model, optimizer, folder):
    saved = torch.load(f"{folder}/rank{dist.get_rank()}.pt")
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    torch.set_rng_state(saved["rng"])


def save_on_rank_zero(model, optimizer, folder):
    if dist.get_rank() == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "rng": torch.get_rng_state()}, f"{folder}/last.pt")


def load_rank_zeros(model, optimizer, folder):  # LINE resume-load
    saved = torch.load(f"{folder}/last.pt")
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    torch.set_rng_state(saved["rng"])


def test_resume_restores_every_state():
    assert_resumes_like_uninterrupted(build_dropout, step, BATCHES, save_every_rank,
                                      load_every_rank, at=1, world_size=2)


def test_resume_from_rank_zeros_rng():
    assert_resumes_like_uninterrupted(build_dropout, step, BATCHES, save_on_rank_zero,
                                      load_rank_zeros, at=1, world_size=2)
