"""Fingerprints of parameter and gradient sets, and the distances between them.

Ranks send fingerprints, not tensors: a digest says whether two sets are bit-identical, and
a strided sample of values (every value for a small model) gives exact differences.
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Sequence

import torch

from harness.models import Fingerprint


def fingerprint(tensors: Iterable[torch.Tensor], max_values: int) -> Fingerprint:
    flat = torch.cat([t.detach().reshape(-1).to(torch.float32) for t in tensors])
    digest = hashlib.sha256(flat.contiguous().numpy().tobytes()).hexdigest()[:16]
    return Fingerprint(
        numel=flat.numel(),
        digest=digest,
        norm=float(flat.double().norm()),
        values=tuple(flat[sample_positions(flat.numel(), max_values)].double().tolist()),
    )


def sample_positions(numel: int, max_values: int) -> torch.Tensor:
    if numel <= max_values:
        return torch.arange(numel)
    return torch.linspace(0, numel - 1, max_values).round().long()


def spread(prints: Sequence[Fingerprint]) -> float:
    """Largest difference of any sampled value between any two of ``prints`` (0.0 if equal)."""
    if len({p.digest for p in prints}) <= 1:
        return 0.0
    _check_comparable(prints)
    return max(max(column) - min(column) for column in zip(*(p.values for p in prints)))


def max_abs_diff(a: Fingerprint, b: Fingerprint) -> float:
    if a.digest == b.digest:
        return 0.0
    _check_comparable((a, b))
    return max(abs(x - y) for x, y in zip(a.values, b.values))


def _check_comparable(prints: Iterable[Fingerprint]) -> None:
    shapes = {(p.numel, len(p.values)) for p in prints}
    if len(shapes) > 1:
        raise ValueError(f"fingerprints of different tensor sets cannot be compared: {shapes}")
