"""The numbers each tensor-parallel fault's finding must report, worked out here in one
process from the model, the data and the formulas, not from the run."""

from __future__ import annotations

import math

import pytest
import torch

from distdoctor.models import RunSpec
from distdoctor.tensor.mlp import REPLICATED, allreduce_bytes, weight_bytes
from distdoctor.training.dropout import mask
from distdoctor.training.workload import batch_ids, build_model, loss_fn, make_dataset


def _first_group(spec: RunSpec) -> tuple[int, ...]:
    return spec.tp_group(0)


def partial_sums(variant: str, spec: RunSpec, measured: dict) -> None:
    """Step 1, the first group: each rank's fc2 output is its columns' partial sum plus
    the bias; the spread is the largest gap between two ranks' outputs."""
    group, tp = _first_group(spec), spec.tp_degree
    model = build_model(spec, 0)
    x, _ = make_dataset(spec)
    ids = batch_ids(spec, 0, 1)[: spec.batch_size // spec.micro_batches]
    model.requires_grad_(False)
    h = torch.tanh(model.fc1(x[ids]))
    width = spec.hidden_features // tp
    outs = torch.stack([h[:, t * width:(t + 1) * width] @ model.fc2.weight[:, t * width:
                                                                          (t + 1) * width].T
                        + model.fc2.bias for t in range(tp)])
    assert measured["layer"] == "fc2" and measured["first_step"] == 1
    assert measured["groups"][0] == list(group)
    assert measured["ranks"] == list(group[1:])
    assert measured["spread"] == pytest.approx(float((outs.amax(0) - outs.amin(0)).max()),
                                               abs=1e-6)


def replica_drift(variant: str, spec: RunSpec, measured: dict) -> None:
    """Step 1: slice t's copy of each replicated parameter takes the step with the share
    of the gradient its rows give (averaged over the replicas), never summed."""
    tp, dp = spec.tp_degree, spec.dp_degree
    x, y = make_dataset(spec)
    after = []
    for t in range(tp):
        shares = []
        for d in range(dp):
            model = build_model(spec, 0)
            rank = next(r for r in range(spec.world_size)
                        if spec.replica(r) == d and spec.tp_slice(r) == t)
            ids = batch_ids(spec, rank, 1)
            rows = ids[t * len(ids) // tp:(t + 1) * len(ids) // tp]
            out, aux = model(x[rows])
            (loss_fn(out, aux, y[rows]) / tp).backward()
            named = dict(model.named_parameters())
            shares.append({n: named[n].grad for n in REPLICATED})
        model = build_model(spec, 0)
        named = dict(model.named_parameters())
        after.append(torch.cat([(named[n] - spec.learning_rate * sum(s[n] for s in shares)
                                 / dp).detach().reshape(-1) for n in REPLICATED]))
    stacked = torch.stack(after)
    assert measured["first_step"] == 1
    assert measured["parameters"] == sorted(REPLICATED)
    assert measured["group"] == list(_first_group(spec))
    assert measured["spread_per_step"]["1"] == pytest.approx(
        float((stacked.amax(0) - stacked.amin(0)).max()), abs=1e-6)
    assert list(measured["spread_per_step"]) == [str(s) for s in range(1, spec.num_steps + 1)]


def dropout_masks(variant: str, spec: RunSpec, measured: dict) -> None:
    group = list(_first_group(spec))
    if variant == "per-rank":
        assert (measured["mask"], measured["first_step"]) == ("dropout after fc2", 1)
        assert measured["steps_differing"] == spec.num_steps
        assert measured["ranks"] == group[1:]
        return
    # every slice of fc1's output got the same columns; the chance that independent masks
    # agree so often, from the share of values the masks kept
    width = spec.hidden_features // spec.tp_degree
    kept = total = 0
    for step in range(1, spec.num_steps + 1):
        m = mask(spec, step, batch_ids(spec, 0, step), 0)[:, :width]
        kept, total = kept + int((m > 0).sum()), total + m.numel()
    share = kept / total
    log_chance = total * (len(group) - 1) * math.log10(share ** 2 + (1 - share) ** 2)
    assert (measured["mask"], measured["group"]) == ("dropout after fc1", group)
    assert measured["steps_identical"] == spec.num_steps
    assert measured["log10_chance_if_independent"] == pytest.approx(log_chance, rel=1e-9)


def node_layout(variant: str, spec: RunSpec, measured: dict) -> None:
    """Swapped on 2 nodes of 2: the pairs (0, 2) and (1, 3) each span both nodes; every
    rank's forward all-reduce (batch x hidden floats) crosses, its data-parallel average
    (the weights it holds) stays inside, and would cross once swapped."""
    n, tp = spec.world_size, spec.tp_degree
    per_rank = allreduce_bytes(spec.batch_size, spec.hidden_features, spec.in_features,
                               input_grad=False)
    assert measured["tensor_groups"] == [[r for r in range(n) if r % (n // tp) == d]
                                         for d in range(n // tp)]
    assert measured["bytes_across_nodes_per_step"] == n * spec.micro_batches * (
        per_rank["forward"] // spec.micro_batches)
    assert measured["bytes_across_nodes_per_step_if_swapped"] == n * weight_bytes(
        spec.hidden_features, spec.in_features, tp)
    assert measured["tensor_allreduces_across_nodes_per_step"] == n * spec.micro_batches


TENSOR_NUMBERS = {"missing-tp-allreduce": partial_sums, "replicated-param-drift": replica_drift,
                  "tp-dropout-rng": dropout_masks, "tp-across-nodes": node_layout}
