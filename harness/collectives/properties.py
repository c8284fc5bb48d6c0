"""The properties every collective must have, shared by the tests and by
``distdoctor check-collective``: example inputs, and the reference they must reproduce.

Integer-valued inputs make every summation order exact (the nccl-tests recipe), so results
compare exactly; avg divides, so it compares with a tolerance. A Case is lists of ints and
names, so a shrunk counterexample reads as plainly as it fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from distdoctor.collectives.algorithms import OPS

DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64,
          "bfloat16": torch.bfloat16}
@dataclass(frozen=True)
class Case:
    world_size: int
    dtype: str
    op: str
    values: list[list[int]]  # one list per rank
    src: int = 0

    def tensors(self) -> list[torch.Tensor]:
        return [torch.tensor(v, dtype=torch.int64).to(DTYPES[self.dtype]) for v in self.values]


@st.composite
def cases(draw, ops=OPS, dtypes=tuple(DTYPES), divisible=False, any_source=False,
          world_sizes=(1, 6)):
    n = draw(st.integers(*world_sizes))
    numel = draw(st.integers(0, 24))
    if divisible:
        numel -= numel % n
    op = draw(st.sampled_from(ops))
    bound = 2 if op == "product" else 8  # bf16 holds every integer result exactly
    row = st.lists(st.integers(-bound, bound), min_size=numel, max_size=numel)
    values = draw(st.lists(row, min_size=n, max_size=n))
    src = draw(st.integers(0, n - 1)) if any_source else 0
    return Case(n, draw(st.sampled_from(dtypes)), op, values, src)


def reduced(case: Case) -> torch.Tensor:
    """The reduction, computed here in float64 (or int64), then cast back."""
    wide = [torch.tensor(v, dtype=torch.float64 if DTYPES[case.dtype].is_floating_point
                         else torch.int64) for v in case.values]
    out = wide[0].clone()
    for x in wide[1:]:
        out = {"sum": out + x, "avg": out + x, "max": torch.maximum(out, x),
               "min": torch.minimum(out, x), "product": out * x}[case.op]
    if case.op == "avg":
        out = out / case.world_size if out.dtype.is_floating_point else \
            torch.div(out, case.world_size, rounding_mode="trunc")
    return out.to(DTYPES[case.dtype])


def same(got: torch.Tensor, expected: torch.Tensor, case: Case) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape, (got, expected)
    if case.op == "avg" and expected.dtype.is_floating_point:
        tolerance = {torch.bfloat16: 1e-2, torch.float32: 1e-6, torch.float64: 1e-12}
        torch.testing.assert_close(got, expected, rtol=tolerance[expected.dtype],
                                   atol=tolerance[expected.dtype])
    else:
        assert torch.equal(got, expected), f"expected {expected.tolist()}, got {got.tolist()}"




def expected_share(case: Case, rank: int) -> torch.Tensor:
    """What reduce-scatter leaves on ``rank``: its ceil(T/N)-element share of the reduction."""
    full = reduced(case)
    share = math.ceil(full.numel() / case.world_size)
    return full[rank * share:(rank + 1) * share]


def mismatch(kind: str, case: Case, outputs: list) -> str | None:
    """How ``outputs`` (one per rank) differ from the reference, or None if they do not."""
    for rank, got in enumerate(outputs):
        expected: torch.Tensor | list[torch.Tensor]
        if kind == "allreduce":
            expected = reduced(case)
        elif kind == "broadcast":
            expected = case.tensors()[case.src]
        elif kind == "allgather":
            expected = case.tensors()
        else:
            expected = expected_share(case, rank)
        try:
            if kind == "allgather":
                assert len(got) == len(expected)
                for g, e in zip(got, expected):
                    same(g, e, case)
            elif kind == "broadcast":
                assert isinstance(expected, torch.Tensor) and torch.equal(got, expected)
            else:
                assert isinstance(expected, torch.Tensor)
                same(got, expected, case)
        except (AssertionError, TypeError, RuntimeError):
            return f"rank {rank}: expected {_show(expected)}, got {_show(got)}"
    return None


def _show(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.tolist()} ({str(value.dtype).removeprefix('torch.')})"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return repr(value)
