"""torch's Flight Recorder on gloo counts sends and receives among a group's operations, so
after a job whose ranks made different numbers of them (a pipeline: the middle stages
twice the ends), its status differs across ranks for the rest of a warm pool's life. The
proofs compare collective numbers across ranks: they must read the collectives' own
numbering. Found as a fault-matrix case that timed out instead of being proven, 2 runs in
7, when a pipeline had run on the same pool before."""

from __future__ import annotations

import pytest

from distdoctor import faults
from distdoctor.dumps.live import in_flight
from distdoctor.faultloop.diagnose import diagnose
from distdoctor.launch.watch import PROVEN
from distdoctor.models import RunSpec

pytestmark = pytest.mark.tier("warm")


def uneven_sends(ctx) -> None:
    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    if ctx.rank == 1:
        for _ in range(5):
            dist.send(t, 2)
    elif ctx.rank == 2:
        for _ in range(5):
            dist.recv(t, 1)
    dist.all_reduce(t)


def numbering(ctx) -> dict:
    return {str(pg): (view["enqueued"], view["completed"]) for pg, view in in_flight().items()}


def test_ranks_that_sent_more_still_number_the_collectives_alike(pools):
    """The last collective enqueued has one number on every rank (what the proofs compare
    across ranks). Completion is marked by gloo's own thread a moment after the call
    returns, so a rank may still count its last collective as running: at most that."""
    pool = pools(4)
    pool.run(uneven_sends, deadline=30).raise_for_status()
    seen = pool.run(numbering, deadline=30).raise_for_status().values
    enqueued = {pg: {v[pg][0] for v in seen} for pg in seen[0]}
    assert all(len(numbers) == 1 for numbers in enqueued.values()), seen
    assert all(v[pg][0] - 1 <= v[pg][1] <= v[pg][0] for v in seen for pg in v), seen


def test_a_ddp_hang_after_uneven_sends_on_the_same_pool_is_still_proven(pools):
    """ZeroRedundancyOptimizer with a head some ranks skip hangs in DDP's own all-reduce
    and ZeRO's broadcasts: proven from the calls and the Flight Recorder, not timed out."""
    pool = pools(4)
    pool.run(uneven_sends, deadline=30).raise_for_status()
    report = diagnose(faults.get("unused-params"), RunSpec(strategy="torch-zero", world_size=4,
                                                           deadline=60), "some-ranks", pool)
    hung = [r.end for r in report.record.ranks if r.end.status == "hung"]
    assert hung and all(e.error.startswith(PROVEN) for e in hung), [e.error for e in hung]
