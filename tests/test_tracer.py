"""The collective tracer, and hang analysis on real hangs of every kind it names."""

from __future__ import annotations

from pathlib import Path

import jobs
import pytest
from sources import line_number

from distdoctor import checks
from distdoctor.checks import collective_mismatch, hang
from distdoctor.models import RankRecord, RunRecord, RunSpec
from distdoctor.trace.evidence import evidence_from_events
from distdoctor.trace.folds import fold

pytestmark = pytest.mark.tier("warm")

JOBS = jobs.__file__


def where(marker: str) -> str:
    return f"{JOBS}:{line_number(JOBS, '# ' + marker)}"


def as_record(result, world_size: int) -> RunRecord:
    ranks = tuple(RankRecord(e.rank, e, evidence_from_events(e.rank, ev, tr))
                  for e, ev, tr in zip(result.ends, result.events, result.traces))
    return RunRecord(RunSpec(world_size=world_size), ranks, result.wall_s, started=result.started)


def test_every_call_is_recorded_with_its_op_peer_shape_dtype_and_line(pools):
    result = pools(3).run(jobs.many_calls, deadline=10).raise_for_status()
    for rank, trace in enumerate(result.traces):
        calls = {c.op: c for c in fold(trace)}
        assert set(calls) == {"all_reduce", "broadcast", "all_gather", "batch_isend_irecv"}
        reduce = calls["all_reduce"]
        assert (reduce.seq, reduce.reduce_op, reduce.shapes, reduce.dtype, reduce.where) == \
            (0, "MAX", ((3,),), "float32", where("ALLREDUCE-LINE"))
        assert reduce.group == (0, 1, 2) and reduce.completed is not None
        cast = calls["broadcast"]
        assert (cast.seq, cast.peer, cast.shapes, cast.dtype) == (1, 2, ((2, 2),), "float64")
        assert calls["all_gather"].shapes == ((1,),) * 4 and calls["all_gather"].dtype == "int64"
        batch = calls["batch_isend_irecv"]
        assert batch.peers == (("send", (rank + 1) % 3), ("recv", (rank - 1) % 3))
        assert batch.async_op and batch.waited is not None and batch.completed is not None
        assert (batch.where, batch.wait_where) == (where("BATCH-LINE"), where("WAIT-LINE"))


def test_a_blocked_call_is_on_record_while_the_rank_is_still_blocked(pools):
    result = pools(2).run(jobs.send_cycle, deadline=60)  # proven long before
    for rank, trace in enumerate(result.traces):
        (call,) = fold(trace)
        assert call.blocking and call.completed is None and call.peer == 1 - rank
        assert result.ends[rank].status == "hung"  # stopped only after the trace was read


@pytest.mark.parametrize("job, world_size, fault, ranks, lines", [
    (jobs.send_cycle, 2, "send-before-receive", (0, 1), ["SEND-CYCLE-LINE"]),
    (jobs.p2p_cycle_with_helper_thread, 3, "p2p-cycle", (0, 1, 2), ["RECV-LINE"]),
    (jobs.skip_collective_on_last_rank, 3, "rank-exited-early", (2,), ["SKIPPED-LINE"]),
    (jobs.mismatched_collectives, 2, "collective-mismatch", (0, 1),
     ["MISMATCH-ALLREDUCE-LINE", "MISMATCH-BROADCAST-LINE"]),
])
def test_hang_analysis_names_the_cause_and_every_blocked_line(pools, job, world_size, fault,
                                                             ranks, lines):
    # proven from the calls in well under a second; a short deadline would instead catch
    # a descheduled rank before its call and call a mismatch a missing rank
    record = as_record(pools(world_size).run(job, deadline=60), world_size)
    (found,) = hang.check(record)
    assert (found.fault, found.ranks) == (fault, ranks)
    for marker in lines:
        assert f"{Path(JOBS).name}:{line_number(JOBS, '# ' + marker)}" in found.symptom
    if fault == "rank-exited-early":
        assert "rank 2: it finished" in found.symptom
        assert found.measured["waiting"] == [0, 1]


def test_hang_analysis_stays_quiet_when_nothing_hung(pools):
    record = as_record(pools(2).run(jobs.many_calls, deadline=10), 2)
    assert hang.check(record) == [] and "hang" in {d.NAME for d in checks.detectors()}


def test_a_silent_reduce_op_mismatch_is_named(pools):
    result = pools(2).run(jobs.reduce_op_differs, deadline=10)
    assert result.ok  # gloo says nothing
    (found,) = collective_mismatch.check(as_record(result, 2))
    assert found.measured["differs"] == ["reduce op"] and found.ranks == (0, 1)
    assert "SUM" in found.symptom and "MAX" in found.symptom


@pytest.mark.parametrize("shapes", [[(4,), (5,)], [(4,), (2, 2)]])
def test_a_shape_mismatch_is_the_root_cause_not_the_connection_reset(pools, shapes):
    result = pools(2).run(jobs.shape_differs, shapes, deadline=10)
    (found,) = collective_mismatch.check(as_record(result, 2))
    assert found.measured["differs"] == ["shape"]
    assert f"{Path(JOBS).name}:{line_number(JOBS, '# SHAPE-LINE')}" in found.symptom


def test_matching_calls_give_no_mismatch(pools):
    assert collective_mismatch.check(as_record(pools(3).run(jobs.many_calls, deadline=10), 3)) == []


def test_a_group_of_the_same_ranks_as_the_world_is_another_channel(pools):
    """Rank 0 all-reduces on a new group of both ranks, rank 1 on the default group: the
    calls share ranks and a number but can never pair; the watch proves it at once."""
    from distdoctor.analysis.waitfor import PROVEN

    result = pools(2).run(jobs.same_ranks_other_group, deadline=60)
    assert [e.status for e in result.ends] == ["hung", "hung"]
    assert result.ends[0].error.startswith(PROVEN + ": ranks 0 -> 1 -> 0")
    calls = [fold(trace)[-1] for trace in result.traces]
    assert [c.pg is not None for c in calls] == [True, False]
    (found,) = hang.check(as_record(result, 2))
    assert found.fault == found.kind == "collective-mismatch"
    assert f"{Path(JOBS).name}:{line_number(JOBS, '# OTHER-GROUP-LINE')}" in found.symptom


def test_sends_and_receives_pair_by_tag_as_gloo_pairs_them(pools):
    """Receives taken in the other tag order are healthy; a tagged send cycle is proven."""
    from distdoctor.analysis.waitfor import PROVEN

    healthy = pools(2).run(jobs.tagged_exchange, False, deadline=60).raise_for_status()
    assert healthy.values == ([0.0, 0.0], [1.0, 2.0])
    assert [(c.op, c.tag) for c in fold(healthy.traces[1])] == [("recv", 2), ("recv", 1)]
    stuck = pools(2).run(jobs.tagged_exchange, True, deadline=60)
    assert all(e.status == "hung" and e.error.startswith(PROVEN + ": ranks 0 -> 1 -> 0")
               for e in stuck.ends), stuck.ends
    assert f"{Path(JOBS).name}:{line_number(JOBS, '# TAGGED-SEND-LINE')}" in stuck.ends[0].error
