"""The resume faults' detectors on healthy look-alikes, and what they read, unit by unit.

Each fault's own cases (detected with its numbers, fixed, verified on every strategy) are
in the fault matrix; here the same restart with nothing lost that matters stays quiet, and
the comparison of saved and restored parts is checked on records made by hand.
"""

from __future__ import annotations

import dataclasses

import pytest

from distdoctor import checks, faults
from distdoctor.analysis.restarts import lost_parts
from distdoctor.faultloop.diagnose import diagnose
from distdoctor.faultloop.runspec import assess, run
from distdoctor.models import (
    Evidence,
    RankEnd,
    RankRecord,
    RestartEvidence,
    RunRecord,
    RunSpec,
)

pytestmark = pytest.mark.tier("warm")


def restarted(strategy: str = "ddp", **knobs) -> RunSpec:
    spec = faults.restarted(RunSpec(strategy=strategy, world_size=4))
    return dataclasses.replace(spec, knobs=dataclasses.replace(spec.knobs, **knobs))


LOOK_ALIKES = {
    # one RNG key for every rank is right when every rank's state is the same: no jitter
    "one-rng-key-for-equal-states": restarted(restored_rng="one-rank", input_jitter=0.0),
    # the loader's position is 0 at an epoch's end: nothing of it to lose
    "restart-at-an-epoch-boundary": restarted(restored_sampler="epoch-only", restart_after=2),
    # SGD without momentum has no state, and a constant rate needs no scheduler
    "stateless-optimizer-on-rank-0": dataclasses.replace(
        restarted(restored_optimizer="rank-0", lr_decay=1.0, restart_after=2),
        optimizer="sgd"),
}


@pytest.mark.parametrize("name", list(LOOK_ALIKES))
def test_a_restart_that_loses_nothing_that_differs_is_quiet(pools, name):
    spec = LOOK_ALIKES[name]
    record = run(spec, pools(spec.world_size))
    assessment = assess(record)
    assert record.finished and assessment.findings == ()
    assert assessment.reference.matches
    restarts = [r.evidence.restarts for r in record.ranks]
    assert all(len(found) == 1 and found[0].parts_lost() == () for found in restarts)


def test_shared_keys_for_replicated_state_are_masked_under_ddp(pools):
    report = diagnose(faults.get("shards-not-restored"), RunSpec(world_size=4), None, pools(4))
    assert report.verdict.outcome == "masked" and report.verdict.before.findings == ()


def _rank(rank: int, saved: dict, restored: dict, step: int = 3) -> RankRecord:
    restart = RestartEvidence(step=step, saved=tuple(saved.items()),
                              restored=tuple(restored.items()))
    return RankRecord(rank, RankEnd(rank, "finished"), Evidence(rank=rank, restarts=(restart,)))


def test_lost_parts_name_whose_part_a_rank_got_the_lowest_of_equal_ones():
    saved = [{"RNG state": "a", "sampler": "s"}, {"RNG state": "a", "sampler": "s"},
             {"RNG state": "c", "sampler": "s"}]
    restored = [saved[0], saved[1], {"RNG state": "a", "sampler": "s"}]
    record = RunRecord(spec=RunSpec(world_size=3), wall_s=0.0,
                       ranks=tuple(_rank(r, saved[r], restored[r]) for r in range(3)))
    (found,) = lost_parts(record)
    assert (found.part, found.step, found.ranks, found.kept) == ("RNG state", 3, (2,), (0, 1))
    assert found.got == ((2, 0),)  # ranks 0 and 1 saved the same bytes: the lowest is named


def test_a_part_restored_as_no_rank_saved_it_is_lost_from_nobody():
    record = RunRecord(spec=RunSpec(world_size=2), wall_s=0.0, ranks=(
        _rank(0, {"parameters": "p0"}, {"parameters": "zz"}),
        _rank(1, {"parameters": "p1"}, {"parameters": "p1"})))
    (found,) = lost_parts(record)
    assert (found.ranks, found.got) == ((0,), ())
    (finding,) = [f for f in checks.run_all(record) if f.fault == "shards-not-restored"]
    assert finding.measured["ranks_not_restored"] == [0]


def test_no_restart_no_parts():
    record = RunRecord(spec=RunSpec(world_size=2), wall_s=0.0, ranks=tuple(
        RankRecord(r, RankEnd(r, "finished"), Evidence(rank=r)) for r in range(2)))
    assert lost_parts(record) == []
