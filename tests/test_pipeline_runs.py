"""Real pipeline runs on warm pools: every schedule against one process, and the cut."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.models import Knobs, RunSpec
from harness.pipeline import PIPELINE_STRATEGIES
from harness.pipeline.model import balance_ranks, partition
from harness.pipeline.report import measured_bubble
from harness.diagnosis.runspec import assess, run
from harness.models import Evidence, RankEnd, RankRecord, RunRecord, StageEvent


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("strategy", PIPELINE_STRATEGIES)
def test_every_schedule_trains_like_one_process(pools, strategy, world_size):
    spec = RunSpec(strategy=strategy, world_size=world_size, batch_size=16, micro_batches=8,
                   num_steps=3)
    record = run(spec, pools(world_size))
    assessment = assess(record)
    assert record.finished
    assert assessment.reference.max_abs_diff <= 1e-5  # loss, gradients and parameters
    assert len(assessment.reference.per_step) == 3
    kinds = Counter((e.step, e.stage, e.micro, e.kind)
                    for r in record.ranks for e in r.evidence.stage_events)
    stages = {s.stage for r in record.ranks for s in r.evidence.stages}
    for step, stage, micro in itertools.product((1, 2, 3), stages, range(8)):
        assert kinds[(step, stage, micro, "F")] == 1 and kinds[(step, stage, micro, "B")] == 1
    split = strategy in ("torch-pipe-zbv", "torch-pipe-dualpipev")
    assert any(kind == "W" for *_, kind in kinds) == split
    layers = sorted(i for r in record.ranks for s in r.evidence.stages
                    for i in range(s.first_layer, s.end_layer))
    assert layers == list(range(len(spec.pipe.layers)))  # every layer on exactly one stage


@pytest.mark.parametrize("order", ["even-odd", "batched"])
@pytest.mark.parametrize("micro", [1, 3, 8])
@pytest.mark.parametrize("strategy", ["pipe-gpipe", "pipe-1f1b"])
def test_ordered_exchanges_complete_for_any_number_of_micro_batches(pools, strategy, micro,
                                                                   order):
    spec = RunSpec(strategy=strategy, world_size=3, batch_size=2 * micro, micro_batches=micro,
                   num_steps=1, deadline=10, knobs=Knobs(p2p_order=order))
    record = run(spec, pools(3))
    assert record.finished and assess(record).reference.matches


def test_gpipe_sends_first_without_harm_since_its_traffic_flows_one_way(pools):
    spec = RunSpec(strategy="pipe-gpipe", world_size=4, batch_size=16, micro_batches=8,
                   num_steps=1, deadline=10, knobs=Knobs(p2p_order="send-first"))
    assert run(spec, pools(4)).finished


@given(st.lists(st.integers(1, 9), min_size=1, max_size=9), st.integers(1, 4))
def test_the_cut_minimises_the_heaviest_stage(weights, parts):
    parts = min(parts, len(weights))
    bounds = partition(weights, parts)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(weights)
    assert all(a < b for a, b in bounds)
    assert all(b == c for (_, b), (c, _) in zip(bounds, bounds[1:]))
    best = min(max(sum(weights[a:b]) for a, b in zip((0, *cuts), (*cuts, len(weights))))
               for cuts in itertools.combinations(range(1, len(weights)), parts - 1))
    assert max(sum(weights[a:b]) for a, b in bounds) == best


def test_ranks_holding_two_stages_are_balanced_as_ranks():
    weights = [1] * 18 + [3.25] * 6
    owner = [0, 1, 2, 3, 0, 1, 2, 3]  # interleaved: stage k on rank k % 4
    per_stage = partition(weights, 8)
    balanced = balance_ranks(weights, per_stage, owner)

    def heaviest(bounds):
        load = Counter()
        for stage, (a, b) in enumerate(bounds):
            load[owner[stage]] += sum(weights[a:b])
        return max(load.values())

    assert heaviest(balanced) <= heaviest(per_stage)
    assert heaviest(balanced) / (sum(weights) / 4) <= 1.15


def test_measured_bubble_is_idle_share_of_the_step():
    def rank(r, spans):
        events = tuple(StageEvent(2, r, i, "F", a, b, b - a) for i, (a, b) in enumerate(spans))
        return RankRecord(r, RankEnd(r, "finished"), Evidence(r, stage_events=events))

    record = RunRecord(RunSpec(strategy="pipe-gpipe"), (rank(0, [(0, 1)]), rank(1, [(1, 3)])), 1)
    assert measured_bubble(record) == pytest.approx(1 - 3 / (2 * 3))


def test_identical_blocks_get_one_cost_so_their_noise_cannot_move_the_cut():
    from harness.pipeline.model import one_cost_per_kind

    assert one_cost_per_kind([1.0, 1.2, 0.8, 1.1, 2.0, 2.4, 2.2], "mmmmaaa") == \
        [1.05] * 4 + [2.2] * 3
    # three calibration passes measured here (us per block: 12 MLP, then 4 attention)
    passes = ["480 546 435 415 506 546 460 507 494 541 454 473 1068 1086 859 1058",
              "547 470 495 556 509 420 373 451 528 525 520 532 989 1034 1028 1108",
              "531 443 540 439 431 502 531 517 494 564 469 435 1177 1090 1146 801"]
    measured = [[float(us) for us in one.split()] for one in passes]
    kinds = "m" * 12 + "a" * 4
    assert len({tuple(partition(m, 4)) for m in measured}) == 2  # raw: the cut moves
    assert len({tuple(partition(one_cost_per_kind(m, kinds), 4)) for m in measured}) == 1
