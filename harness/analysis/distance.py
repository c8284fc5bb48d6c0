"""How far apart parameter sets are: between two fingerprints, and across a run's ranks
step by step.

Pure reads of recorded evidence, free of torch: the checks, the single-process
comparison and the terminal tables all measure with the same ruler.
"""

from __future__ import annotations

import operator
from typing import Iterable, Sequence

from distdoctor.models.evidence import Fingerprint
from distdoctor.models.record import RunRecord


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
    return max(map(abs, map(operator.sub, a.values, b.values)), default=0.0)


def _check_comparable(prints: Iterable[Fingerprint]) -> None:
    shapes = {(p.numel, len(p.values)) for p in prints}
    if len(shapes) > 1:
        raise ValueError(f"fingerprints of different tensor sets cannot be compared: {shapes}")


def param_history(record: RunRecord, rank: int) -> tuple[Fingerprint, ...]:
    evidence = record.ranks[rank].evidence
    initial = () if evidence.initial_params is None else (evidence.initial_params,)
    return initial + tuple(s.params for s in evidence.steps)


def spreads(record: RunRecord) -> tuple[float, ...]:
    """Parameter spread across ranks per step (0 = after construction), while all ranks ran."""
    histories = [param_history(record, r.rank) for r in record.ranks]
    common = min(len(h) for h in histories)
    return tuple(spread([h[i] for h in histories]) for i in range(common))


def built_spread(record: RunRecord) -> float | None:
    """Parameter spread across ranks as each rank built its model, before any wrapping."""
    prints = [r.evidence.built_params for r in record.ranks]
    built = [p for p in prints if p is not None]
    return spread(built) if built and len(built) == len(prints) else None
