"""Detector branches no run of the fault matrix reaches, each on a hand-made record whose
numbers are worked out here."""

from __future__ import annotations

from checks import collective_mismatch
from harness.models import Call, Evidence, RankEnd, RankRecord, RunRecord, RunSpec


def call(rank: int, op: str, seq: int = 0, peer: int | None = None, shape=(4,),
         dtype: str = "float32", reduce_op: str | None = None, line: int = 10) -> Call:
    return Call(id=seq, rank=rank, op=op, seq=seq, group=(0, 1), peer=peer, peers=(),
                shapes=(tuple(shape),), dtype=dtype, reduce_op=reduce_op,
                where=f"train.py:{line + rank}", async_op=False, entered=0.0, completed=1.0)


def calls_record(*per_rank: list[Call], status: str = "finished") -> RunRecord:
    ranks = tuple(RankRecord(r, RankEnd(r, status), Evidence(r, calls=tuple(calls)))
                  for r, calls in enumerate(per_rank))
    return RunRecord(RunSpec(world_size=len(per_rank)), ranks, 1.0)


def test_a_send_and_its_receive_of_other_shapes_differ_in_shape_alone():
    (found,) = collective_mismatch.check(calls_record(
        [call(0, "send", peer=1, shape=(4,))], [call(1, "recv", peer=0, shape=(5,))]))
    assert found.measured["differs"] == ["shape"]  # send against recv is no op mismatch
    assert found.headline == "shape differs at send #0 from rank 0 to rank 1"
    assert found.ranks == (0, 1)
    assert "rank 0: send to 1 (#0, (4,), float32) at train.py:10" in found.symptom
    assert "rank 1: recv from 0 (#0, (5,), float32) at train.py:11" in found.symptom


def test_a_send_and_its_receive_of_other_dtypes_differ_in_dtype_alone():
    (found,) = collective_mismatch.check(calls_record(
        [call(0, "isend", peer=1)], [call(1, "irecv", peer=0, dtype="float64")]))
    assert found.measured["differs"] == ["dtype"]


def test_an_all_reduce_over_other_dtypes_differs_in_dtype():
    (found,) = collective_mismatch.check(calls_record(
        [call(0, "all_reduce", reduce_op="SUM")],
        [call(1, "all_reduce", dtype="int64", reduce_op="SUM")]))
    assert found.measured["differs"] == ["dtype"]
    assert found.headline == "dtype differs at collective #0"


def test_broadcasts_from_different_roots_differ_in_root():
    (found,) = collective_mismatch.check(calls_record(
        [call(0, "broadcast", peer=0)], [call(1, "broadcast", peer=1)]))
    assert found.measured["differs"] == ["root or peer"]
    assert "rank 1: broadcast rooted at 1" in found.symptom


def test_matching_sends_and_receives_and_a_hung_run_are_left_alone():
    assert collective_mismatch.check(calls_record(
        [call(0, "send", peer=1)], [call(1, "recv", peer=0)])) == []
    assert collective_mismatch.check(calls_record(  # the hang check names those
        [call(0, "send", peer=1, shape=(4,))], [call(1, "recv", peer=0, shape=(5,))],
        status="hung")) == []
