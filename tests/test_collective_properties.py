"""Every collective, ours on both transports and gloo's own, against a reference computed
here, over world sizes 1-6, ragged sizes, every op, dtype and source rank.

The cases and the reference (computed in this process, in float64 or int64) are in
distdoctor.collectives.properties, which `distdoctor check-collective` uses too.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from distdoctor.collectives.algorithms import OPS
from distdoctor.collectives.jobs import run_native, run_ours
from distdoctor.collectives.properties import DTYPES, Case, cases, expected_share, reduced, same
from distdoctor.launch.pool import shared_pool

pytestmark = pytest.mark.tier("warm")

# how many examples, and whether they are the same every run, is the profile's (conftest)
EXAMPLES = settings(deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def run(kind: str, name: str, case: Case, **kwargs) -> list:
    pool = shared_pool(case.world_size, mesh=(kind == "queue"))
    if kind == "native":
        result = pool.run(run_native, name, case.tensors(), deadline=20, **kwargs)
        return list(result.raise_for_status().values)
    result = pool.run(run_ours, kind, name, case.tensors(), deadline=20, **kwargs)
    return [value for value, _ in result.raise_for_status().values]


TRANSPORTS = ["queue", "gloo"]


@pytest.mark.parametrize("kind", TRANSPORTS)
@pytest.mark.parametrize("name", ["ring-allreduce", "tree-allreduce"])
@EXAMPLES
@given(case=cases())
def test_our_allreduce_equals_the_reference(kind, name, case):
    for got in run(kind, name, case, op=case.op):
        same(got, reduced(case), case)


@pytest.mark.parametrize("kind", TRANSPORTS)
@EXAMPLES
@given(case=cases(any_source=True))
def test_our_broadcast_delivers_the_source_tensor_from_any_rank(kind, case):
    for got in run(kind, "broadcast", case, src=case.src):
        assert torch.equal(got, case.tensors()[case.src])


@pytest.mark.parametrize("kind", TRANSPORTS)
@EXAMPLES
@given(case=cases())
def test_our_allgather_lists_every_ranks_tensor(kind, case):
    for got in run(kind, "allgather", case):
        assert [t.tolist() for t in got] == case.values
        assert all(t.dtype == DTYPES[case.dtype] for t in got)


@pytest.mark.parametrize("kind", TRANSPORTS)
@EXAMPLES
@given(case=cases())
def test_our_reduce_scatter_gives_each_rank_its_share_of_the_reduction(kind, case):
    for rank, got in enumerate(run(kind, "reduce-scatter", case, op=case.op)):
        same(got, expected_share(case, rank), case)


# gloo's own collectives, on what gloo supports: AVG only for floating types, and
# reduce_scatter on equal shares with SUM or AVG.
FLOAT_OR_EXACT = [op for op in OPS if op != "avg"]


@EXAMPLES
@given(case=cases(ops=FLOAT_OR_EXACT) | cases(ops=("avg",), dtypes=("float32", "float64")))
def test_gloo_all_reduce_equals_the_reference(case):
    for got in run("native", "allreduce", case, op=case.op):
        same(got, reduced(case), case)


@EXAMPLES
@given(case=cases(any_source=True))
def test_gloo_broadcast_delivers_the_source_tensor(case):
    for got in run("native", "broadcast", case, src=case.src):
        assert torch.equal(got, case.tensors()[case.src])


@EXAMPLES
@given(case=cases())
def test_gloo_all_gather_lists_every_ranks_tensor(case):
    for got in run("native", "allgather", case):
        assert [t.tolist() for t in got] == case.values


@EXAMPLES
@given(case=cases(ops=("sum",), dtypes=("float32", "float64", "int64"), divisible=True))
def test_gloo_reduce_scatter_gives_each_rank_its_share(case):
    full, n = reduced(case), case.world_size
    share = full.numel() // n
    for rank, got in enumerate(run("native", "reduce-scatter", case, op=case.op)):
        same(got, full[rank * share:(rank + 1) * share], case)
