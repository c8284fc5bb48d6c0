"""Fingerprints of parameter and gradient sets, taken on the rank that holds them.

Ranks send fingerprints, not tensors: a digest says whether two sets are bit-identical, and
a strided sample of values (every value for a small model) gives exact differences. The
distances between fingerprints are in ``distdoctor.analysis.distance``, free of torch.
"""

from __future__ import annotations

import hashlib
from typing import Iterable

import torch

from distdoctor.analysis.positions import spread_positions
from distdoctor.models import Fingerprint


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
    return torch.tensor(spread_positions(numel, max_values), dtype=torch.long)
