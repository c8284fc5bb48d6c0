"""Detector branches no run of the fault matrix reaches, each on a hand-made record whose
numbers are worked out here."""

from __future__ import annotations

import math

import pytest

from distdoctor.checks import (
    collective_mismatch,
    divergent_parameters,
    hang,
    over_memory_budget,
    unbalanced_stages,
    unused_params,
)
from distdoctor.models import (
    BackwardEvidence,
    Call,
    Evidence,
    Fingerprint,
    MemoryEvidence,
    PipeStepEvidence,
    RankEnd,
    RankRecord,
    RunRecord,
    RunSpec,
    StageEvent,
    StepEvidence,
)

pytestmark = pytest.mark.tier("warm")


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
    assert "rank 1 made broadcast rooted at 1" in found.symptom


def test_a_scatter_whose_root_alone_passes_the_list_matches():
    """torch's distribute_tensor scatters: the root passes its output and the list, the
    others their output alone (it was reported as a shape mismatch)."""
    import dataclasses

    root = dataclasses.replace(call(0, "scatter", peer=0), shapes=((8, 8), (8, 8), (8, 8)))
    assert collective_mismatch.check(calls_record([root], [call(1, "scatter", peer=0,
                                                                shape=(8, 8))])) == []
    (found,) = collective_mismatch.check(calls_record([root], [call(1, "scatter", peer=0,
                                                                    shape=(4, 8))]))
    assert found.measured["differs"] == ["shape"]


def test_matching_sends_and_receives_and_a_hung_run_are_left_alone():
    assert collective_mismatch.check(calls_record(
        [call(0, "send", peer=1)], [call(1, "recv", peer=0)])) == []
    assert collective_mismatch.check(calls_record(  # the hang check names those
        [call(0, "send", peer=1, shape=(4,))], [call(1, "recv", peer=0, shape=(5,))],
        status="hung")) == []


# -- over_memory_budget ------------------------------------------------------------------------
def memory_record(strategy: str, budget: int, stage: int = 1, world: int = 2) -> RunRecord:
    """Two ranks holding a 1000-parameter model in fp32 with SGD's state of nothing."""
    held = MemoryEvidence(step=1, stage=stage, world_size=world, params=4000, grads=4000,
                          optimizer=0, gathered=0, budget=budget, model_params=1000,
                          largest_layer=500, layers=2, optimizer_tensors=0)
    ranks = tuple(RankRecord(r, RankEnd(r, "finished"), Evidence(r, memory=(held,)))
                  for r in range(world))
    return RunRecord(RunSpec(strategy=strategy, world_size=world), ranks, 1.0)


def test_a_budget_nothing_fits_is_said_so_with_no_fix_to_apply():
    (found,) = over_memory_budget.check(memory_record("zero1", budget=1))
    assert found.fix == "no ZeRO stage on any number of ranks fits this budget"
    assert found.fix_changes == {} and found.ranks == (0, 1)
    assert found.measured["bytes_per_rank"] == {"0": 8000, "1": 8000}
    assert "planned" not in found.measured


def test_a_strategy_off_the_zero_family_gets_no_stage_change():
    (found,) = over_memory_budget.check(memory_record("pipe-1f1b", budget=6000, stage=0))
    assert found.fix_changes == {}
    assert found.fix.startswith("pipe-1f1b has no ZeRO stages to move up")
    assert "8000 bytes" in found.symptom and "33% over" in found.symptom  # 8000 / 6000


def test_within_the_budget_is_no_finding():
    assert over_memory_budget.check(memory_record("zero1", budget=8000)) == []


# -- divergent_parameters on the built-in workload ------------------------------------------------
def spread_record(per_rank: list[list[float]]) -> RunRecord:
    """``per_rank[rank]``: the one parameter's value after construction, then per step."""
    def fingerprint(value: float) -> Fingerprint:
        return Fingerprint(1, repr(value), abs(value), (value,))

    ranks = []
    for rank, values in enumerate(per_rank):
        steps = tuple(StepEvidence(step=n, epoch=0, sample_ids=(), loss=0.0,
                                   params=fingerprint(v), grad_local=None, grad_synced=None,
                                   allreduce_calls=1, allreduce_bytes=4, gradient_bytes=4)
                      for n, v in enumerate(values[1:], 1))
        ranks.append(RankRecord(rank, RankEnd(rank, "finished"), Evidence(
            rank, initial_params=fingerprint(values[0]), steps=steps)))
    return RunRecord(RunSpec(world_size=len(per_rank)), tuple(ranks), 1.0)


def test_replicas_that_start_alike_and_part_later_are_divergent_parameters_with_no_fix():
    (found,) = divergent_parameters.check(spread_record([[1.0, 0.5, 0.25], [1.0, 0.5, 0.75]]))
    assert found.fault == "divergent-parameters" and found.fix_changes == {}
    assert found.measured["first_divergent_step"] == 2
    assert found.measured["spread_per_step"] == [0.0, 0.0, 0.5]
    assert found.measured["ranks_differing_from_rank_0"] == [1]
    assert found.headline == "spread 0.5 from step 2"


# -- unbalanced_stages ------------------------------------------------------------------------
def stage_record(cpu_per_rank: list[float], steps: int = 4) -> RunRecord:
    ranks = []
    for rank, cpu in enumerate(cpu_per_rank):
        fp = Fingerprint(1, "p", 0.0, (0.0,))
        events = tuple(StageEvent(n, rank, 0, kind, 0.0, cpu / 2, cpu / 2)
                       for n in range(1, steps + 1) for kind in "FB")
        done = tuple(PipeStepEvidence(n, None, fp, fp, 0.0, 1.0) for n in range(1, steps + 1))
        ranks.append(RankRecord(rank, RankEnd(rank, "finished"), Evidence(
            rank, stage_events=events, pipe_steps=done)))
    return RunRecord(RunSpec(strategy="pipe-1f1b", world_size=len(cpu_per_rank)),
                     tuple(ranks), 1.0)


def test_stages_under_two_ms_of_compute_are_not_judged_however_uneven():
    assert unbalanced_stages.check(stage_record([0.000375, 0.000125])) == []  # 0.25 ms mean
    (found,) = unbalanced_stages.check(stage_record([0.375, 0.125]))  # the same split, 250 ms
    # rank 0 at 0.375 s against a mean of 0.25 s, at every step: 1.5x, a zero-width
    # interval (binary fractions, so the sums are exact)
    assert found.measured["max_over_mean_time"] == 1.5
    assert found.measured["max_over_mean_time_interval"] == [1.5, 1.5]


# -- hang ---------------------------------------------------------------------------------
def test_ranks_stopped_in_no_call_and_no_user_frame_are_an_unknown_hang():
    ranks = tuple(RankRecord(r, RankEnd(r, "hung"), Evidence(r)) for r in range(2))
    (found,) = hang.check(RunRecord(RunSpec(), ranks, 1.0))
    assert (found.fault, found.ranks) == ("hang-unknown", (0, 1))
    assert found.measured["blocked_in"] == {
        "0": "in no traced call, and no stack of the user's code",
        "1": "in no traced call, and no stack of the user's code"}


# -- unused_params ------------------------------------------------------------------------
def test_missing_gradients_where_a_rank_issued_no_all_reduce_are_reported():
    def done(calls: int) -> StepEvidence:
        fp = Fingerprint(1, "g", 1.0, (1.0,))
        return StepEvidence(step=1, epoch=0, sample_ids=(), loss=0.0, params=fp,
                            grad_local=fp, grad_synced=fp, allreduce_calls=calls,
                            allreduce_bytes=4 * calls, gradient_bytes=4)

    ranks = tuple(RankRecord(r, RankEnd(r, "finished"), Evidence(
        r, backward=(BackwardEvidence(1, ("aux.weight",)),) if r == 1 else (),
        steps=(done(1 if r == 0 else 0),))) for r in range(2))
    (found,) = unused_params.check(RunRecord(RunSpec(), ranks, 1.0))
    assert found.measured["sync_problem"] == \
        "rank 1 issued no gradient all-reduce at all (gradients silently not averaged)"
    assert found.measured["no_grad_params"] == {"1": ["aux.weight"]}


# -- unused_params, from DDP's error ------------------------------------------------------
DDP_ERROR = ("RuntimeError: Expected to have finished reduction in the prior iteration "
             "before starting a new one. ...\nParameter indices which did not receive grad "
             "for rank 1: 2 3\n In addition, you can set ...")


def test_ddp_s_parameter_indices_are_named_from_the_ranks_own_record():
    ranks = (RankRecord(0, RankEnd(0, "raised", error="Connection reset by peer"),
                        Evidence(0, ddp_params=("a.weight", "a.bias", "b.weight", "b.bias"))),
             RankRecord(1, RankEnd(1, "raised", error=DDP_ERROR),
                        Evidence(1, ddp_params=("a.weight", "a.bias", "b.weight", "b.bias"))))
    (found,) = unused_params.check(RunRecord(RunSpec(), ranks, 1.0))
    assert found.measured["no_grad_params"] == {"1": ["b.weight", "b.bias"]}
    assert found.ranks == (1,)


def test_a_clean_ddp_run_of_user_code_is_judged_by_ddps_error_and_passes():
    """The built-in workload records missing gradients itself, so unused_params reads DDP's
    error only where that is absent, as in user code; a clean DDP run of it stays quiet."""
    import jobs

    from distdoctor import checks
    from distdoctor.launch.pool import shared_pool
    from distdoctor.userjob.reporting.record import script_record

    result = shared_pool(2, evidence=True).run(jobs.ddp_training, 3, deadline=60)
    record = script_record(result.raise_for_status().ends, result.traces, result.wall_s,
                           result.started, 60)
    assert not any(r.evidence.backward for r in record.ranks)  # no early return
    assert all(r.evidence.ddp_params == ("weight", "bias") for r in record.ranks)
    assert unused_params.check(record) == [] and checks.run_all(record) == ()


def _mask_record(values: tuple[float, ...], steps: int,
                 other: tuple[float, ...] | None = None) -> RunRecord:
    """Two ranks of one tensor-parallel group holding the same sharded-activation mask at
    every step (rank 1 ``other``, where given)."""
    from distdoctor.models import Fingerprint, GroupTensor

    def mask(rank: int) -> Fingerprint:
        held = values if rank == 0 or other is None else other
        return Fingerprint(len(held), repr(held), 1.0, held)

    ranks = tuple(RankRecord(r, RankEnd(r, "finished"), Evidence(r, group_tensors=tuple(
        GroupTensor(s, "dropout after fc1", "mask", False, (0, 1), mask(r))
        for s in range(1, steps + 1)))) for r in (0, 1))
    return RunRecord(RunSpec(world_size=2), ranks, 1.0)


def test_identical_slice_masks_are_judged_by_how_likely_chance_makes_them():
    """Half the values kept: two independent masks agree on each value with chance 1/2.
    8 values at 2 steps (chance 2^-16) is left alone; 64 values at 6 steps (2^-384) is the
    same RNG state on every rank."""
    from distdoctor.checks import tp_dropout_rng

    half = (0.0, 2.0) * 4
    assert tp_dropout_rng.check(_mask_record(half, 2)) == []
    (found,) = tp_dropout_rng.check(_mask_record(half * 8, 6))
    assert found.measured["log10_chance_if_independent"] == pytest.approx(-384 * 0.30103,
                                                                           rel=1e-4)
    assert tp_dropout_rng.check(_mask_record((2.0,) * 64, 6)) == []  # nothing dropped


def test_a_mask_position_a_rank_could_not_read_is_left_out_of_the_comparison():
    """A user's dropout handed a zero (after a ReLU) shows no mask there (MASK_UNKNOWN):
    slices whose zeros fall elsewhere are still identical where both ranks read the mask,
    and the chance counts only those positions; one known position that differs is
    independent masks."""
    from distdoctor.checks import tp_dropout_rng
    from distdoctor.models.evidence import MASK_DROPPED, MASK_KEPT, MASK_UNKNOWN

    half = (MASK_DROPPED, MASK_KEPT) * 32
    zeros_here = tuple(MASK_UNKNOWN if i % 8 == 0 else v for i, v in enumerate(half))
    zeros_there = tuple(MASK_UNKNOWN if i % 8 == 4 else v for i, v in enumerate(half))
    (found,) = tp_dropout_rng.check(_mask_record(zeros_here, 6, zeros_there))
    # 48 of 64 positions read on both ranks at each of 6 steps, 2/3 of them kept: two
    # independent masks agree on each with chance (2/3)^2 + (1/3)^2 = 5/9
    assert found.measured["log10_chance_if_independent"] == pytest.approx(
        48 * 6 * math.log10(5 / 9), rel=1e-6)
    parted = tuple(MASK_DROPPED if i == 1 else v for i, v in enumerate(zeros_there))
    assert zeros_here[1] == MASK_KEPT  # read on both ranks, and rank 1 drops it
    assert tp_dropout_rng.check(_mask_record(zeros_here, 6, parted)) == []


def test_a_tensor_parallel_group_wider_than_a_node_is_not_a_swapped_mesh():
    """Four tensor-parallel ranks on nodes of two: no layout keeps the group inside one,
    so there is nothing to swap; on nodes of four, the same group is inside already."""
    from distdoctor.checks import tp_across_nodes
    from distdoctor.models import GroupTraffic

    def record(per_node: int) -> RunRecord:
        ranks = tuple(RankRecord(r, RankEnd(r, "finished"), Evidence(
            r, node=r // per_node, traffic=(GroupTraffic(1, "tensor", (0, 1, 2, 3), 1, 512),)))
            for r in range(4))
        return RunRecord(RunSpec(world_size=4), ranks, 1.0)

    assert tp_across_nodes.check(record(2)) == [] and tp_across_nodes.check(record(4)) == []
