"""The tensor-parallel input rules, on hand-made records whose numbers are worked out here:
a column-parallel layer's replicated input must be the same on every rank of its group,
when it parts after an earlier layer the group agreed on, the ranks drew it apart; when
the first input of the forward parts, they were handed different batches."""

from __future__ import annotations

import pytest

from distdoctor.checks import (
    missing_tp_allreduce,
    replicated_param_drift,
    tp_batches_differ,
    tp_dropout_rng,
)
from distdoctor.models import (
    BatchEvidence,
    Evidence,
    Fingerprint,
    GroupTensor,
    RankEnd,
    RankRecord,
    RunRecord,
    RunSpec,
)

pytestmark = pytest.mark.tier("unit")

Y = (0.5, -1.0, 2.0, 0.25, -0.75, 1.5, -2.0, 1.0)  # 0.down's output, the same on both ranks
X = (1.0, 1.0, -1.0, 0.0, 2.0, -0.5, 0.5, 1.0)  # the residual it is added to
KEPT = ((1, 1, 0, 1, 1, 0, 1, 1), (1, 0, 1, 1, 0, 1, 1, 1))  # each rank's own dropout mask
SCALE = 4 / 3  # dropout at rate 0.25 scales what it keeps by 1 / (1 - 0.25)


def tensor(step: int, name: str, kind: str, values) -> GroupTensor:
    values = tuple(float(v) for v in values)
    return GroupTensor(step, name, kind, True, (0, 1),
                       Fingerprint(len(values), repr(values), 1.0, values), "train.py:26")


def record(*per_rank: list[GroupTensor]) -> RunRecord:
    ranks = tuple(RankRecord(r, RankEnd(r, "finished"), Evidence(r, group_tensors=tuple(ts)))
                  for r, ts in enumerate(per_rank))
    return RunRecord(RunSpec(world_size=len(per_rank)), ranks, 1.0)


def forward(rank: int, dropped) -> list[GroupTensor]:
    """One step's forward on ``rank``: 0.up handed X, 0.down putting out Y, 1.up handed
    X + ``dropped`` (Y after this rank's dropout, or anything else)."""
    return [tensor(1, "0.up", "input", X), tensor(1, "0.down", "activation", Y),
            tensor(1, "1.up", "input", [x + d for x, d in zip(X, dropped)])]


def dropout(rank: int) -> list[float]:
    return [y * k * SCALE for y, k in zip(Y, KEPT[rank])]


def test_inputs_drawn_apart_after_an_agreed_output_are_dropout_with_its_rate_measured():
    (found,) = tp_dropout_rng.check(record(forward(0, dropout(0)), forward(1, dropout(1))))
    assert (found.kind, found.ranks, found.first_step) == ("tp-dropout-rng", (1,), 1)
    assert found.measured["layer"] == "1.up" and found.measured["after"] == "0.down"
    assert found.measured["dropout_rate"] == pytest.approx(0.25, abs=1e-4)
    # the largest difference: where one rank kept 2.0 * 4/3 and the other dropped it
    assert found.measured["spread"] == pytest.approx(2.0 * SCALE)
    assert "dropout at rate 0.25 with masks that differ" in found.symptom


def test_inputs_drawn_apart_by_something_else_are_said_without_a_rate():
    noise = [0.01 * (i + 1) for i in range(len(Y))]  # each rank's own noise, not a mask
    (found,) = tp_dropout_rng.check(record(forward(0, Y), forward(1, [
        y + n for y, n in zip(Y, noise)])))
    assert found.measured["dropout_rate"] is None
    assert "something between them drew other values on each rank" in found.symptom


def test_quiet_when_the_group_agrees_and_when_the_first_input_already_differs():
    agreed = record(forward(0, Y), forward(1, Y))
    assert tp_dropout_rng.check(agreed) == [] and tp_batches_differ.check(agreed) == []
    # handed different batches: nothing the group agreed on came before, so no draw is shown
    other = [tensor(1, "0.up", "input", [-x for x in X])] + forward(1, Y)[1:]
    assert tp_dropout_rng.check(record(forward(0, Y), other)) == []


def test_a_first_input_that_differs_is_the_group_handed_different_batches_with_the_samples():
    other = [tensor(1, "0.up", "input", [-x for x in X])] + forward(1, Y)[1:]
    parted = record(forward(0, Y), other)
    (found,) = tp_batches_differ.check(parted)
    assert (found.kind, found.ranks, found.first_step) == ("tp-batches-differ", (1,), 1)
    assert found.measured["layer"] == "0.up" and found.measured["groups"] == [[0, 1]]
    assert found.measured["spread"] == pytest.approx(4.0)  # 2.0 against -2.0
    assert found.measured["first_batches"] == {} and "loader" not in found.symptom
    # with the loaders' batches recorded, the samples each rank was dealt are said
    dealt = tuple(RankRecord(r.rank, r.end, Evidence(
        r.rank, group_tensors=r.evidence.group_tensors, batches=(BatchEvidence(
            0, 0, tuple(range(r.rank, 16, 2)), "DistributedSampler", 0, "train.py:30",
            trains=True),))) for r in parted.ranks)
    (found,) = tp_batches_differ.check(RunRecord(parted.spec, dealt, 1.0))
    assert "rank 0: 0, 2, 4, 6, ...; rank 1: 1, 3, 5, 7, ..." in found.symptom
    assert found.where == ("train.py:30", "train.py:26")  # the loop first, then the plan
    # a draw inside the forward is dropout's finding, not this one
    assert tp_batches_differ.check(record(forward(0, dropout(0)), forward(1, dropout(1)))) == []


def test_a_partial_sum_upstream_is_told_as_the_missing_all_reduce_not_as_dropout():
    """fc2's output differs (each rank's partial sum), and so then does what 1.up is
    handed: the all-reduce explains both."""
    partial = [tensor(1, "0.up", "input", X), tensor(1, "0.down", "activation", Y[::-1]),
               tensor(1, "1.up", "input", [x + y for x, y in zip(X, Y[::-1])])]
    both = record(forward(0, Y), partial)
    assert tp_dropout_rng.check(both) == []
    assert [f.kind for f in missing_tp_allreduce.check(both)] == ["missing-tp-allreduce"]


def test_replicated_parameters_that_part_after_inputs_were_drawn_apart_are_explained():
    head = [tensor(1, "2.weight", "parameter", (0.1,)), tensor(1, "2.weight", "parameter", (0.2,))]
    drawn = record(forward(0, dropout(0)) + head[:1], forward(1, dropout(1)) + head[1:])
    assert replicated_param_drift.check(drawn) == []
    assert [f.kind for f in tp_dropout_rng.check(drawn)] == ["tp-dropout-rng"]
    # the same drift with the inputs alike is the drift's own finding
    alone = record(forward(0, Y) + head[:1], forward(1, Y) + head[1:])
    assert [f.kind for f in replicated_param_drift.check(alone)] == ["replicated-param-drift"]
