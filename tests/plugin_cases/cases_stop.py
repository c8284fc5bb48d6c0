"""Tests that hang or block, for tests/test_pytest_plugin.py: it runs each in a project of
its own and stops it from outside (a deadline, Ctrl-C, pytest-timeout). A test says it has
reached the point to stop at by writing a byte to the FIFO named by DISTDOCTOR_CASES_FIFO."""

import os
import threading

import pytest
import torch.distributed as dist


def _reached() -> None:
    with open(os.environ["DISTDOCTOR_CASES_FIFO"], "wb") as fifo:
        fifo.write(b"!")


@pytest.mark.world_size(3)
def test_warm_three_ranks(rank):
    dist.barrier()


@pytest.mark.world_size(3, deadline=2)
def test_spin_past_deadline(rank):
    print(f"rank {rank} starts", flush=True)
    if rank == 0:
        while True:  # LINE spin
            pass
    dist.barrier()  # LINE barrier


@pytest.mark.world_size(4, deadline=2)
def test_bigint_spin_on_every_rank(rank):
    has_value = {0}  # LINE loop-start
    seen = 1
    while len(has_value) < 4:  # a tree broadcast from rank 3 that only rank 0 could start
        seen = seen << 1
        if rank == 3 and seen < 0:
            has_value |= {1, 2, 3}
    dist.barrier()  # LINE loop-end


@pytest.mark.world_size(2)
def test_spin_until_interrupted(rank):
    if rank == 0:
        _reached()
        while True:
            pass
    dist.barrier()


def ready(value):
    return value


def test_parent_blocks_after_a_job(ranks):
    assert ranks(2).run(ready, 5) == [5, 5]
    _reached()
    threading.Event().wait()
