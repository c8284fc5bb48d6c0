"""The single-process reference for pipeline runs: every layer in one process, whole batch.

Each rank's stages name their layer ranges, so the reference's loss, gradients and
parameters for exactly those layers can be compared with what the rank recorded.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import torch

from distdoctor.analysis.distance import max_abs_diff
from distdoctor.models import Fingerprint, Knobs, ReferenceComparison, RunRecord, RunSpec
from distdoctor.pipeline.model import build_layers, make_data, step_batch
from distdoctor.pipeline.train import loss_fn
from distdoctor.training.fingerprint import fingerprint


@dataclass(frozen=True)
class PipeReferenceStep:
    loss: float
    grads: tuple[torch.Tensor, ...]  # per layer, flattened
    params: tuple[torch.Tensor, ...]  # per layer, flattened, after the step


def pipeline_reference(spec: RunSpec) -> tuple[PipeReferenceStep, ...]:
    """Every step's loss, gradients and parameters, trained in one process. The knobs
    (the stage split, the send/receive order) cannot change them, so a run and its fixed
    re-run share one computation."""
    return _reference(dataclasses.replace(spec, knobs=Knobs()))


@functools.lru_cache(maxsize=4)
def _reference(spec: RunSpec) -> tuple[PipeReferenceStep, ...]:
    layers = build_layers(spec.pipe, spec.seed)
    optimizer = torch.optim.SGD(layers.parameters(), lr=spec.learning_rate)
    x, y = make_data(spec)
    steps = []
    for step in range(1, spec.num_steps + 1):
        batch = step_batch(spec, step)
        optimizer.zero_grad(set_to_none=True)
        out = x[batch]
        for layer in layers:
            out = layer(out)
        loss = loss_fn(out, y[batch])
        loss.backward()
        grads = tuple(_flat([p.grad for p in layer.parameters()]) for layer in layers)
        optimizer.step()
        params = tuple(_flat(list(layer.parameters())) for layer in layers)
        steps.append(PipeReferenceStep(loss.item(), grads, params))
    return tuple(steps)


def compare_pipeline(record: RunRecord, reference: tuple[PipeReferenceStep, ...],
                     tolerance: float = 1e-5) -> ReferenceComparison:
    """Largest difference in loss, gradients or parameters from the reference, per step."""
    values = record.spec.fingerprint_values
    per_step = []
    for index, expected in enumerate(reference):
        diffs = []
        for rank in record.ranks:
            evidence = rank.evidence
            layers = [i for s in evidence.stages for i in range(s.first_layer, s.end_layer)]
            if index >= len(evidence.pipe_steps) or not layers:
                diffs.append(math.inf)
                continue
            got = evidence.pipe_steps[index]
            diffs.append(max(
                max_abs_diff(got.grads, _print(expected.grads, layers, values)),
                max_abs_diff(got.params, _print(expected.params, layers, values)),
                abs(got.loss - expected.loss) if got.loss is not None else 0.0))
        per_step.append(max(diffs) if diffs else math.inf)
    return ReferenceComparison(max(per_step, default=math.inf), tuple(per_step), tolerance)


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _print(per_layer: tuple[torch.Tensor, ...], layers: list[int], values: int) -> Fingerprint:
    return fingerprint([per_layer[i] for i in layers], values)
