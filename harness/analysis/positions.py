"""Where a tensor of ``numel`` values is sampled: ``count`` positions spread evenly from
its first value to its last, the same on every rank.

Computed in integers: ``torch.linspace`` works in float32, whose spacing above 2**24 is
more than 1, so for a tensor of 307,200,000 values (CIFAR's training set as one tensor; an
embedding of a 50k vocabulary by 4k) its last position rounded up past the end and the
sample raised IndexError.
"""

from __future__ import annotations

from fractions import Fraction


def spread_positions(numel: int, count: int) -> list[int]:
    """``min(count, numel)`` positions in ``range(numel)``, evenly spread, the first and the
    last included; each the nearest integer to ``i * (numel - 1) / (count - 1)``, a half
    to the even one, as torch rounds (the positions samplers took before, at sizes
    float32 holds exactly)."""
    count = min(count, numel)
    if count <= 1:
        return [0] * count
    return [round(Fraction(i * (numel - 1), count - 1)) for i in range(count)]
