"""Warm pools: many jobs on one group, and recovery from jobs that raise, die or hang."""

from __future__ import annotations

import pickle

import jobs
import proctable
import pytest

from distdoctor.launch.pool import PoolStartError, RankPool
from distdoctor.launch.results import JobResult, RanksFailed
from distdoctor.models import RankEnd

pytestmark = pytest.mark.tier("warm")


@pytest.fixture
def pool():
    """A private pool, for tests that break it on purpose; every rank it ever forked is
    checked afterwards in the process table (a zombie counts as reaped by nobody)."""
    with RankPool(2) as pool:
        yield pool
    assert pool.forked, "the pool never forked: nothing was checked"
    assert {pid for pid in pool.forked if proctable.present(pid)} == set()


def test_many_jobs_share_one_group(pools):
    pool = pools(4)
    pool.start()
    generation, pids = pool.generations, pool.pids
    for length in range(1, 41):
        result = pool.run(jobs.rank_sum, length, deadline=10)
        assert result.values == tuple([10.0] * length for _ in range(4))
    assert (pool.generations, pool.pids) == (generation, pids)
    assert [v[2] for v in pool.run(jobs.whoami).values] == list(pids)


def test_a_raising_job_does_not_poison_the_pool(pool):
    pool.start()
    old = pool.pids
    failed = pool.run(jobs.raise_on_rank, 0, deadline=10)
    assert failed.root_cause.rank == 0
    with pytest.raises(RanksFailed, match="rank 0 raised first"):
        failed.raise_for_status()
    assert pool.run(jobs.rank_sum, 2, deadline=10).values == ([3.0, 3.0], [3.0, 3.0])
    assert pool.generations == 2
    assert not set(old) & proctable.children()


def test_a_hanging_job_is_stopped_and_the_group_reformed_together(pool):
    pool.start()
    old = pool.pids
    hung = pool.run(jobs.emit_then_hang, 3, deadline=60)  # a send cycle: proven at once
    assert [e.status for e in hung.ends] == ["hung", "hung"]
    assert hung.events == ((("tick", 0), ("tick", 1), ("tick", 2)),) * 2  # kept past the hang
    ranks = pool.run(jobs.whoami, deadline=10).values
    assert [(r, n) for r, n, _ in ranks] == [(0, 2), (1, 2)]
    assert not set(old) & set(p for *_, p in ranks)
    assert not set(old) & proctable.children()


def test_a_job_that_cannot_be_pickled_is_refused_before_any_rank_runs(pool):
    pool.start()
    pids = pool.pids
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        pool.run(lambda ctx: None)
    assert pool.pids == pids and pool.run(jobs.whoami).ok


def test_a_result_that_cannot_be_sent_back_is_a_raised_rank_and_the_pool_goes_on(pool):
    result = pool.run(jobs.unpicklable_result, deadline=10)
    assert [e.status for e in result.ends] == ["raised", "raised"]
    assert "could not be sent" in result.ends[0].error
    assert pool.run(jobs.rank_sum, 1, deadline=10).values == ([3.0], [3.0])
    assert pool.generations == 2


def test_a_rank_that_exits_mid_job_retires_the_group_and_the_next_job_runs(pool):
    died = pool.run(jobs.die_on_rank, 1, 5, deadline=10)
    assert (died.ends[1].status, died.ends[1].exitcode) == ("died", 5)
    assert pool.run(jobs.rank_sum, 2, deadline=10).values == ([3.0, 3.0], [3.0, 3.0])
    assert pool.generations == 2 and len(pool.forked) == 4


def test_a_group_that_does_not_form_in_time_is_refused_and_reaped():
    pool = RankPool(2, start_timeout=0.001)
    with pytest.raises(PoolStartError, match="the 2 ranks did not form a gloo group within"):
        pool.start()
    assert pool.pids == () and len(pool.forked) == 2
    assert not any(proctable.present(pid) for pid in pool.forked)


def test_a_rank_dying_while_the_group_forms_is_named_with_its_exit(monkeypatch):
    import distdoctor.launch.rank as rank_module

    monkeypatch.setattr(rank_module, "_join_group",  # copied into the ranks by the fork
                        jobs.join_or_die(rank_module._join_group, dying_rank=1))
    pool = RankPool(3)
    with pytest.raises(PoolStartError, match=r"rank 1 died while forming the group "
                                             r"\(exited with code 3 without reporting"):
        pool.start()
    assert not any(proctable.present(pid) for pid in pool.forked)


@pytest.mark.parametrize("make, message", [
    (lambda: RankPool(0), "world size must be at least 1, got 0"),
    (lambda: RankPool(2, start_method="forkserver"), "start method must be fork or spawn"),
    (lambda: RankPool(2).run(jobs.whoami, deadline=0), "deadline must be positive, got 0"),
])
def test_bad_pool_arguments_are_refused_before_any_rank_starts(make, message):
    before = proctable.children()
    with pytest.raises(ValueError, match=message):
        make()
    assert proctable.children() == before


def test_an_exit_is_described_by_its_code_or_its_signal():
    from types import SimpleNamespace

    from distdoctor.launch.watch import describe_exit

    assert describe_exit(SimpleNamespace(exitcode=-9)) == "killed by signal SIGKILL"
    assert describe_exit(SimpleNamespace(exitcode=-11)) == "killed by signal SIGSEGV"
    assert describe_exit(SimpleNamespace(exitcode=7)) == \
        "exited with code 7 without reporting a result"
    assert describe_exit(SimpleNamespace(exitcode=None)) == "still running"


def test_close_reaps_every_rank():
    pool = RankPool(3)
    pool.start()
    pids = pool.pids
    assert all(proctable.alive(p) for p in pids)
    pool.close()
    assert not any(proctable.alive(p) for p in pids)


def test_the_root_cause_is_the_failure_not_the_peers_connection_errors():
    echo = ("Traceback (most recent call last):\n  ...\nRuntimeError: [pair.cc:537] Read error "
            "[127.0.0.1]:4242: Connection reset by peer. This is typically caused by ...")
    ends = (RankEnd(0, "died", at=0.020, error="exited with code 7", exitcode=7),
            RankEnd(1, "raised", at=0.012, error=echo),
            RankEnd(2, "stopped", at=1.0))
    assert JobResult(ends, (None,) * 3, ((),) * 3, 1.0).root_cause.rank == 0
    only_echoes = (RankEnd(0, "raised", at=0.3, error=echo),
                   RankEnd(1, "raised", at=0.2, error=echo))
    assert JobResult(only_echoes, (None,) * 2, ((),) * 2, 1.0).root_cause.rank == 1


def test_a_group_that_cannot_form_fails_with_the_ranks_reason():
    before = proctable.children()
    pool = RankPool(2, backend="nccl")  # passed through to the ranks; no GPU here
    with pytest.raises(PoolStartError, match="nccl needs a CUDA GPU"):
        pool.start()
    assert proctable.children() == before and pool.pids == ()


def test_spawned_ranks_run_jobs_and_report_failures_like_forked_ones():
    """Spawn is for parents that already initialised CUDA; slower, but the same contract."""
    with RankPool(2, start_method="spawn") as pool:
        assert pool.run(jobs.rank_sum, 2, deadline=60).values == ([3.0, 3.0], [3.0, 3.0])
        died = pool.run(jobs.die_on_rank, 1, 9, deadline=60)
        assert (died.root_cause.rank, died.root_cause.status, died.root_cause.exitcode) == \
            (1, "died", 9)
        pids = pool.pids
    assert not any(proctable.alive(p) for p in pids)
