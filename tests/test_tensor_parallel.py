"""Tensor parallelism, written out and torch's, against one process: the same batches, the
same init, SGD; parameters after three steps and the first step's gradients put back
together from every rank's slices; and the all-reduces and weight bytes per rank against
the formulas (issue 21's first part: the layers, before the strategy, faults and
detectors)."""

from __future__ import annotations

import functools

import jobs
import pytest
import torch

from distdoctor.models import RunSpec
from distdoctor.tensor.mlp import TensorParallelMLP, allreduce_bytes, full_tensors, weight_bytes
from distdoctor.tensor.steps import train_steps
from distdoctor.training.workload import build_model, loss_fn, make_dataset

pytestmark = pytest.mark.tier("warm")

SPEC = RunSpec(strategy="ddp", world_size=1)
STEPS = 3


@functools.lru_cache(maxsize=None)
def one_process() -> tuple[dict, dict]:
    """The parameters after STEPS steps and the first step's gradients, in one process."""
    torch.manual_seed(SPEC.seed)
    model = build_model(SPEC, 0)
    optimizer = torch.optim.SGD(model.parameters(), lr=SPEC.learning_rate)
    x, y = make_dataset(SPEC)
    grads = {}
    for step in range(STEPS):
        ids = list(range(step * SPEC.batch_size, (step + 1) * SPEC.batch_size))
        optimizer.zero_grad()
        out, aux = model(x[ids])
        loss_fn(out, aux, y[ids]).backward()
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        optimizer.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}, grads


def gap(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[n] - b[n]).abs().max()) for n in a)


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("kind", ["tp", "torch-tp"])
def test_tensor_parallel_training_matches_one_process(pools, kind, world_size):
    result = pools(world_size).run(train_steps, kind, SPEC, STEPS, deadline=60)
    result.raise_for_status()
    ranks = list(result.values)
    params, grads = one_process()
    model = TensorParallelMLP(build_model(SPEC, 0), 0, world_size)
    assert gap(full_tensors(model, [r["params"] for r in ranks]), params) <= 1e-5
    assert gap(full_tensors(model, [r["grads"] for r in ranks]), grads) <= 1e-5
    if world_size > 1:  # each rank holds a slice of fc1 and fc2, not the whole
        assert ranks[0]["params"]["fc1.weight"].shape[0] == SPEC.hidden_features // world_size


@pytest.mark.parametrize("input_grad", [True, False], ids=["inner-block", "first-block"])
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_one_allreduce_each_way_per_block_and_a_slice_of_the_weights(pools, world_size,
                                                                    input_grad):
    """The digest: an all-reduce after each matmul pair. Forward sums fc2's partial outputs
    (batch x hidden); backward sums the gradient of fc1's input (batch x inputs) when that
    input asks for one (a block above others; the data itself does not, and autograd skips
    it). Each rank holds 1/TP of the split layers and the replicated ones whole."""
    result = pools(world_size).run(train_steps, "tp", SPEC, 1, input_grad, deadline=60)
    result.raise_for_status()
    expected = allreduce_bytes(SPEC.batch_size, SPEC.hidden_features, SPEC.in_features,
                               input_grad)
    for rank in result.values:
        if world_size == 1:
            assert rank["traffic"]["calls"] == {"forward": 0, "backward": 0}
        else:
            assert rank["traffic"] == {"calls": {"forward": 1, "backward": int(input_grad)},
                                       "bytes": expected}
        assert rank["held"] == weight_bytes(SPEC.hidden_features, SPEC.in_features,
                                            world_size)


@functools.lru_cache(maxsize=None)
def _trained(strategy: str, world_size: int, sampler: str = "distributed"):
    from distdoctor.faultloop.runspec import assess, run
    from distdoctor.launch.pool import shared_pool
    from distdoctor.models import Knobs

    spec = RunSpec(strategy=strategy, world_size=world_size, knobs=Knobs(sampler=sampler))
    record = run(spec, shared_pool(world_size))
    return record, assess(record)


@pytest.mark.parametrize("strategy, world_size", [
    ("tp", 1), ("tp", 2), ("tp", 4), ("torch-tp", 2), ("torch-tp", 4), ("tp-dp", 2),
    ("tp-dp", 4)])
def test_the_tensor_parallel_strategies_train_like_one_process_and_stay_quiet(strategy,
                                                                              world_size):
    """`train --strategy tp|torch-tp|tp-dp`: the whole model, put back together from the
    slices on every rank, matches single-process SGD on the replicas' batches at every
    step, every rank agrees, and no detector fires on the clean run (the ranks of one
    tensor-parallel group read the same batch by design: not duplicate samples)."""
    record, assessment = _trained(strategy, world_size)
    assert record.finished
    assert assessment.reference.max_abs_diff <= 1e-5
    assert assessment.param_spread == 0.0
    assert assessment.findings == (), [f.headline for f in assessment.findings]
    tp = record.spec.tp_degree
    batches = [[s.sample_ids for s in r.evidence.steps] for r in record.ranks]
    for rank in range(world_size):  # a group reads one batch; the replicas read apart
        assert batches[rank] == batches[rank - rank % tp]
        if rank >= tp:
            assert set(batches[rank][0]).isdisjoint(batches[rank - tp][0])


def test_replicas_of_a_tensor_parallel_run_that_share_a_seed_are_found():
    """tp-dp at N=4 with one shuffle seed everywhere: the two replicas (ranks 0 and 2 hold
    the same slice) read the same samples; the ranks inside a group are not counted."""
    record, assessment = _trained("tp-dp", 4, "shared-seed")
    (found,) = assessment.findings
    assert found.fault == "shared-shuffle-seed" and found.ranks == (0, 2)
    assert found.measured["max_overlap_share"] == 1.0


@pytest.mark.parametrize("strategy, world_size", [("tp", 2), ("tp", 4), ("tp-dp", 4)])
def test_a_train_run_records_each_groups_bytes_per_step_as_the_formulas_give(strategy,
                                                                           world_size):
    """Per step and rank, in a real train run: the tensor-parallel group's all-reduces are
    fc2's forward one (batch x hidden x 4 bytes; the data asks for no gradient, so the
    backward one is skipped), the replicas' average moves the weights the rank holds."""
    record, _ = _trained(strategy, world_size)
    spec = record.spec
    tp, dp = spec.tp_degree, spec.dp_degree
    per_block = allreduce_bytes(spec.batch_size, spec.hidden_features, spec.in_features,
                                input_grad=False)
    for rank in record.ranks:
        traffic = {(t.step, t.purpose): t for t in rank.evidence.traffic}
        for step in range(1, spec.num_steps + 1):
            tensor, data = traffic[(step, "tensor")], traffic[(step, "data")]
            assert (tensor.calls, tensor.bytes) == (1, per_block["forward"])
            assert tensor.group == spec.tp_group(rank.rank) and len(tensor.group) == tp
            held = weight_bytes(spec.hidden_features, spec.in_features, tp) if dp > 1 else 0
            assert data.bytes == held and len(data.group) == dp


@functools.lru_cache(maxsize=None)
def one_attention(d: int, heads: int, steps: int) -> tuple[dict, dict]:
    from distdoctor.tensor.attention import MultiHeadAttention, attention_data

    torch.manual_seed(0)
    model = MultiHeadAttention(d, heads)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    grads = {}
    for step, (x, y) in enumerate(attention_data(d, steps)):
        optimizer.zero_grad()
        (model(x) - y).pow(2).mean().backward()
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        optimizer.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}, grads


def _whole_attention(per_rank: list[dict]) -> dict:
    """q, k, v cut by output rows (heads), o by input columns; o's bias whole."""
    whole = {}
    for name in per_rank[0]:
        parts = [r[name] for r in per_rank]
        if name.startswith(("q.", "k.", "v.")):
            whole[name] = torch.cat(parts, dim=0)
        elif name == "o.weight":
            whole[name] = torch.cat(parts, dim=1)
        else:
            whole[name] = parts[0]
    return whole


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("kind", ["tp", "torch-tp"])
def test_attention_split_by_heads_matches_one_process(pools, kind, world_size):
    """4 heads of width 4 over 1, 2 or 4 ranks: each rank's heads attend alone, and the
    block (parameters after 3 steps, the first step's gradients) matches one process; the
    written-out block all-reduces once forward (2 x 6 x 16 floats: its output) and once
    backward (its input's gradient, summed once for q, k and v)."""
    from distdoctor.tensor.attention import attention_steps

    result = pools(world_size).run(attention_steps, kind, 16, 4, STEPS, deadline=60)
    result.raise_for_status()
    ranks = list(result.values)
    params, grads = one_attention(16, 4, STEPS)
    assert gap(_whole_attention([r["params"] for r in ranks]), params) <= 1e-5
    assert gap(_whole_attention([r["grads"] for r in ranks]), grads) <= 1e-5
    assert ranks[0]["params"]["q.weight"].shape[0] == 16 // world_size
    if kind == "tp" and world_size > 1:
        for rank in ranks:
            assert rank["traffic"] == {"calls": {"forward": 1, "backward": 1},
                                       "bytes": {"forward": 2 * 6 * 16 * 4,
                                                 "backward": 2 * 6 * 16 * 4}}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", [None, 1])
def test_a_users_dropout_on_a_slice_is_read_exactly_and_one_seed_is_told(seed):
    """Each rank's mask of the dropout on its columns, as the tracer read it from the
    layer's input and output, against the mask torch's dropout draws from the same RNG
    state (replayed in the job); the dropout on the row-parallel output, which every rank
    holds whole, is not read as a slice. Seeded per rank the check is quiet; seeded alike
    every slice gets one mask, and tp_dropout_rng says so."""
    from distdoctor.checks import tp_dropout_rng
    from distdoctor.launch.pool import shared_pool
    from distdoctor.userjob.reporting.record import script_record

    steps = 2
    result = shared_pool(2, evidence=True).run(jobs.tp_dropout_masks, seed, steps, deadline=60)
    record = script_record(result.raise_for_status().ends, result.traces, result.wall_s,
                           result.started, 60)
    for rank, replayed in zip(record.ranks, result.values):
        masks = [t for t in rank.evidence.group_tensors if t.kind == "mask"]
        assert [(t.step, t.name, t.alike, t.group) for t in masks] == [
            (s, "2", False, (0, 1)) for s in range(1, steps + 1)]
        assert [list(t.value.values) for t in masks] == replayed
        assert {v for t in masks for v in t.value.values} == {-1.0, 0.0, 1.0}
        assert rank.evidence.dropouts == ("2", "4")  # both seen dropping, once each
    found = tp_dropout_rng.check(record)
    if seed is None:
        assert found == [] and result.values[0] != result.values[1]
    else:
        assert [f.measured["mask"] for f in found] == ["2"]
        assert found[0].measured["steps_identical"] == steps


@pytest.mark.timeout(120)
def test_a_dropout_on_a_whole_tensor_shaped_like_a_slice_is_not_told_as_one():
    """The block's input, dropped after a column-parallel layer whose slice has its shape:
    the layers alone would call it a slice, and one seed on every rank would then look like
    identical slices. What each rank was handed is recorded beside the mask, and the ranks
    were handed the same values: copies of one tensor, whose masks must agree."""
    from distdoctor.checks import run_all, tp_dropout_rng
    from distdoctor.launch.pool import shared_pool
    from distdoctor.userjob.reporting.record import script_record

    result = shared_pool(2, evidence=True).run(jobs.tp_dropout_beside_a_slice, 2, deadline=60)
    record = script_record(result.raise_for_status().ends, result.traces, result.wall_s,
                           result.started, 60)
    for rank in record.ranks:  # judged a slice by the layers, and its masks alike
        assert [(t.step, t.kind) for t in rank.evidence.group_tensors if t.name == "drop"] \
            == [(1, "mask"), (1, "dropout-input"), (2, "mask"), (2, "dropout-input")]
    assert len({t.value.digest for r in record.ranks for t in r.evidence.group_tensors
                if t.name == "drop" and t.kind == "mask" and t.step == 1}) == 1
    assert tp_dropout_rng.check(record) == [] and run_all(record) == ()
