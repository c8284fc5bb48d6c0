"""Dropout masks the single-process reference can reproduce whatever the parallelism.

A mask row is drawn from a generator keyed by (seed, step, site, sample id), so one
process training a replica's whole batch draws the same masks as the tensor-parallel
ranks that each hold a slice of it, micro-batches and replicas notwithstanding. ``stream``
stands for an RNG state: 0 is the one a tensor-parallel group shares; a rank drawing with
its own state (``stream`` = its slice + 1) gets masks no other rank has.
"""

from __future__ import annotations

import torch

from distdoctor.models import RunSpec


def mask(spec: RunSpec, step: int, ids, site: int, stream: int = 0) -> torch.Tensor:
    """Scaled keep-mask (0 or 1/(1-p)) for ``ids``' rows, hidden_features wide."""
    p = spec.knobs.dropout
    rows = []
    for sample in ids:
        key = (((spec.seed * 1_000 + step) * 4 + site) * 100_000 + int(sample)) * 64 + stream
        gen = torch.Generator().manual_seed(key)
        rows.append(torch.rand(spec.hidden_features, generator=gen) >= p)
    return torch.stack(rows).float() / (1.0 - p)


def reference_masks(spec: RunSpec, step: int, ids) -> tuple[torch.Tensor, torch.Tensor]:
    """Both sites' masks as one process, or a correct tensor-parallel group, draws them."""
    return mask(spec, step, ids, 0), mask(spec, step, ids, 1)
