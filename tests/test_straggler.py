"""The straggler check on hand-made timelines whose waits can be worked out by hand: it fires
on the rank the others wait for, with that wait's share of their step, and says where
the rank's time goes; it stays quiet on noise, on everyone slow, and on a rank a few per
cent slower."""

from __future__ import annotations

import random
import re
from dataclasses import replace

import pytest

from distdoctor.analysis.stragglers import waiting
from distdoctor.checks import straggler
from distdoctor.models import (
    Arrival,
    Call,
    Evidence,
    GapSample,
    Phase,
    RankEnd,
    RankRecord,
    RunRecord,
    RunSpec,
)

pytestmark = pytest.mark.tier("unit")

BASE = 0.010  # each rank's work per step, seconds
SYNC = 0.001  # the collective itself, once everyone is in


def timeline(world: int, steps: int, delay=lambda rank, step: 0.0, noise=lambda rank, step: 0.0,
             where="loader", buckets=1, traced=False, clock=lambda rank: 0.0) -> RunRecord:
    """A bulk-synchronous job: each step every rank fetches a batch, computes ``BASE`` (+
    ``noise``), and meets the others in ``buckets`` all-reduces made as DDP makes them
    (one after another as its backward goes, waited for at its end; by the Flight
    Recorder) or, ``traced``, blocking all-reduces through the tracer; then steps its
    optimiser. ``delay`` is extra time a rank spends in its loader (``where="loader"``)
    or in its own code before it (``where="own"``, sampled at train.py:40 in
    log_metrics, called from the loop at train.py:36). ``clock``: each rank's monotonic
    clock minus the shared one (ranks on machines apart); their wall-clock offsets say
    so."""
    phases: dict[int, list[Phase]] = {r: [] for r in range(world)}
    samples: dict[int, list[GapSample]] = {r: [] for r in range(world)}
    arrivals: dict[int, list[Arrival]] = {r: [] for r in range(world)}
    calls: dict[int, list[Call]] = {r: [] for r in range(world)}
    group = tuple(range(world))
    start, seq = 100.0, 0
    for n in range(steps):
        arrive: dict[int, list[float]] = {}
        for r in range(world):
            t = start
            if where == "own" and delay(r, n):
                samples[r].append(GapSample(n, "train.py:40", "log_metrics", delay(r, n),
                                            "train.py:36"))
                t += delay(r, n)
            loader = 0.001 + (delay(r, n) if where == "loader" else 0.0)
            phases[r].append(Phase("loader", t, t + loader, n, "train.py:30"))
            t += loader
            work = BASE + noise(r, n)
            phases[r].append(Phase("forward", t, t + work / 3, n, "train.py:32"))
            arrive[r] = [t + work / 3 + (i + 1) * (2 * work / 3) / buckets
                         for i in range(buckets)]
        for i in range(buckets):
            seq += 1
            last = max(arrive[r][i] for r in range(world))
            for r in range(world):
                at = arrive[r][i]
                if traced:  # blocking: everyone leaves together, and goes on from there
                    calls[r].append(Call(seq, r, "all_reduce", seq - 1, group, None, (),
                                         ((8,),), "float32", "SUM", "train.py:34", False,
                                         at + clock(r), completed=last + SYNC + clock(r)))
                    for j in range(i + 1, buckets):
                        arrive[r][j] += last + SYNC - at
                else:
                    arrivals[r].append(Arrival(None, group, seq, "all_reduce", at + clock(r)))
        done = max(arrive[r][-1] for r in range(world)) + SYNC
        for r in range(world):
            phases[r].append(Phase("backward", phases[r][-1].end, done, n, "train.py:33"))
            phases[r].append(Phase("optimizer", done, done + 0.001, n, "train.py:35"))
        start = done + 0.001
    ranks = []
    apart = any(clock(r) for r in range(world))
    for r in range(world):
        moved = [replace(p, start=p.start + clock(r), end=p.end + clock(r)) for p in phases[r]]
        evidence = Evidence(r, phases=tuple(moved), gap_samples=tuple(samples[r]),
                            arrivals=tuple(arrivals[r]), calls=tuple(calls[r]),
                            wall_offset=-clock(r) if apart else None)
        ranks.append(RankRecord(r, RankEnd(r, "finished"), evidence))
    return RunRecord(RunSpec(world_size=world), tuple(ranks), 1.0)


def step_seconds(delay: float, buckets: int = 1) -> float:
    """One step of ``timeline`` with one rank ``delay`` late and no noise."""
    return 0.001 + delay + BASE + SYNC + 0.001


def late(rank: int, seconds: float, every: int = 1):
    return lambda r, n: seconds if r == rank and n % every == 0 else 0.0


def test_a_slow_loader_on_one_rank_is_named_with_the_others_wait_and_the_loader_line():
    found = straggler.check(timeline(4, 40, late(1, 0.020)))
    assert [f.ranks for f in found] == [(1,)]
    f = found[0]
    assert not f.inconclusive and f.kind == "straggler"
    # every other rank waits the whole 20 ms of every step: 20 / (step) of it
    assert f.measured["wait_share"] == pytest.approx(0.020 / step_seconds(0.020), rel=1e-6)
    assert f.measured["last_in_steps"] == f.measured["steps_judged"] == 39
    assert f.measured["share_of_waiting"] == pytest.approx(1.0)
    assert f.measured["late_ms_quartiles"][1] == pytest.approx(20.0, abs=1e-6)
    assert "waiting for its data loader's next batch at train.py:30, 20.0 ms a step more" \
        in f.symptom
    assert "DataLoader workers" in f.fix and f.where == ("train.py:30",)


def test_extra_work_in_the_ranks_own_code_is_named_at_the_sampled_line():
    found = straggler.check(timeline(4, 40, late(2, 0.015), where="own"))
    assert [f.ranks for f in found] == [(2,)]
    f = found[0]
    assert f.measured["wait_share"] == pytest.approx(0.015 / step_seconds(0.015), rel=1e-6)
    assert "its own code, 15.0 ms a step more than the others, mostly at train.py:40 in " \
        "log_metrics, reached from the training loop at train.py:36 (sampled there for " \
        "about 15.0 ms a step)" in f.symptom
    assert f.where == ("train.py:36", "train.py:40") and "move the work at train.py:36" in f.fix


def test_a_rank_that_stalls_every_tenth_step_is_a_straggler_too():
    # 300 ms every tenth step, 14 ms steps otherwise: the others wait most of the run
    record = timeline(4, 60, late(0, 0.300, every=10))
    found = straggler.check(record)
    assert [f.ranks for f in found] == [(0,)]
    # 5 judged stalls (steps 10, 20, ..., 50; step 0 is start-up)
    stalls, plain = 5, 59 - 5
    expected = stalls * 0.300 / (stalls * step_seconds(0.300) + plain * step_seconds(0.0))
    assert found[0].measured["wait_share"] == pytest.approx(expected, rel=1e-6)
    assert found[0].measured["last_in_steps"] == 5


@pytest.mark.parametrize("seed", range(6))
def test_noise_spread_over_every_rank_is_no_straggler(seed):
    rng = random.Random(seed)
    jitter = {(r, n): rng.expovariate(1 / 0.004) for r in range(4) for n in range(60)}
    assert straggler.check(timeline(4, 60, noise=lambda r, n: jitter[r, n])) == []


@pytest.mark.parametrize("seed", range(4))
def test_everyone_slow_and_irregular_is_no_straggler(seed):
    # a CPU hog on every core: each rank now and then loses a whole time slice or two
    rng = random.Random(seed)
    lost = {(r, n): rng.choice([0.0, 0.0, 0.0, 0.004, 0.008, 0.030])
            for r in range(4) for n in range(60)}
    assert straggler.check(timeline(4, 60, noise=lambda r, n: lost[r, n])) == []


def test_a_rank_a_few_per_cent_slower_is_not_worth_a_finding():
    # 0.6 ms late in a 13 ms step: 5% of each other rank's step, below the 10% floor
    assert straggler.check(timeline(4, 60, late(3, 0.0006))) == []


def test_a_wait_under_five_milliseconds_a_step_is_the_schedulers_not_the_ranks():
    # 4 ms late at every step of 8 ms: half the step, but a time slice's worth or so
    record = timeline(4, 40, late(1, 0.004), noise=lambda r, n: -0.008)
    assert straggler.check(record) == []
    assert straggler.check(timeline(4, 40, late(1, 0.006), noise=lambda r, n: -0.008))



def clocked(record: RunRecord, per_step, job=None) -> RunRecord:
    """``record`` with each rank's main-thread CPU clock read at its optimiser steps' ends,
    advancing ``per_step(rank)`` = (ran, waited) seconds a step; ``job(rank)``: its
    threads' seconds over the whole job (start-up included), else none."""
    ranks = []
    for r in record.ranks:
        ran, waited = per_step(r.rank)
        phases, steps = [], 0
        for p in r.evidence.phases:
            if p.kind == "optimizer":
                steps += 1
                p = replace(p, cpu=(ran * steps, 0.5 + waited * steps))
            phases.append(p)
        evidence = replace(r.evidence, phases=tuple(phases),
                           cpu_s=job(r.rank) if job is not None else None)
        ranks.append(replace(r, evidence=evidence))
    return replace(record, ranks=tuple(ranks))


def test_a_rank_late_because_it_waited_for_a_cpu_over_the_judged_steps_is_the_machines():
    """Rank 1 is 6 ms late at every step and its main thread waited 6 ms a step longer
    for a CPU, running no longer: the machine's, undecided. Its threads' clock over the
    whole job says it ran 0.4 s more (start-up: importing torch took longer there), which
    over 39 steps would read as 10 ms a step of work; the steps' own clock decides."""
    record = clocked(timeline(2, 40, late(1, 0.006)),
                     lambda r: (0.010, 0.006 if r == 1 else 0.0),
                     job=lambda r: (2.0 + 0.4 * r, 0.1))
    [found] = straggler.check(record)
    assert found.inconclusive and found.ranks == (1,)
    assert found.measured["cpu_ms_beyond_others"] == pytest.approx([0.0, 6.0], abs=1e-6)
    assert "its main thread waited 6.0 ms a step longer than the others' for one (the " \
        "kernel's run-queue delay, over the judged steps) and ran 0.0 ms longer" in \
        found.symptom and "the machine's, not the program's" in found.symptom
    # without the steps' clock, the job's misleads: its start-up reads as work
    [job_only] = straggler.check(clocked(timeline(2, 40, late(1, 0.006)), lambda r: (0, 0),
                                         job=lambda r: (2.0 + 0.4 * r, 0.1)))
    assert not job_only.inconclusive


def test_a_rank_the_machine_stalls_now_and_then_is_judged_by_its_mean_lateness():
    """Rank 1 stalls 300 ms at every third step and is on time at the others (the suite
    beside a CPU hog on every core once measured a median of -13 ms, quartiles up to 302):
    the median says "not late" while the stalls cost the others most of the waiting. Its
    main thread waited 100 ms a step longer for a CPU, the mean of its lateness, and ran
    no longer: the machine's. The same stalls run as work are the program's."""
    stalls = timeline(2, 40, late(1, 0.300, every=3))
    [found] = straggler.check(clocked(stalls, lambda r: (0.010, 0.100 if r == 1 else 0.0)))
    assert found.measured["late_ms_quartiles"][1] == pytest.approx(0.0, abs=1e-6)
    assert found.inconclusive and "the machine's, not the program's" in found.symptom
    mean = float(re.search(r"against ([\d.]+) ms a step late on average", found.symptom)[1])
    assert mean == pytest.approx(300 * 13 / 39, abs=0.1)  # 13 of the 39 judged steps
    [worked] = straggler.check(clocked(timeline(2, 40, late(1, 0.300, every=3), where="own"),
                                       lambda r: (0.010 + (0.100 if r == 1 else 0.0), 0.0)))
    assert not worked.inconclusive and "the machine's" not in worked.symptom


def test_a_rank_late_from_its_own_work_on_a_busy_machine_is_still_a_straggler():
    """Rank 1 ran 6 ms a step more and waited 4 ms longer for a CPU too (the work it
    added waits its turn on a busy machine): the work it ran decides."""
    record = clocked(timeline(2, 40, late(1, 0.006), where="own"),
                     lambda r: (0.010 + (0.006 if r == 1 else 0.0), 0.004 if r == 1 else 0))
    [found] = straggler.check(record)
    assert not found.inconclusive and found.ranks == (1,)
    assert found.measured["cpu_ms_beyond_others"] == pytest.approx([6.0, 4.0], abs=1e-6)


def test_a_step_clock_missing_on_one_rank_falls_back_to_the_jobs():
    record = clocked(timeline(2, 40, late(1, 0.006)),
                     lambda r: (0.010, 0.006 if r == 1 else 0.0),
                     job=lambda r: (2.0, 0.1 + 0.39 * r))
    ranks = list(record.ranks)
    ranks[0] = replace(ranks[0], evidence=replace(ranks[0].evidence, phases=tuple(
        replace(p, cpu=None) for p in ranks[0].evidence.phases)))
    [found] = straggler.check(replace(record, ranks=tuple(ranks)))
    # 0.39 s over 40 steps: 9.75 ms a step, by the job's clock over all its threads
    assert found.measured["cpu_ms_beyond_others"] == pytest.approx([0.0, 9.75], abs=1e-6)
    assert "its threads waited 9.8 ms a step longer" in found.symptom and \
        "over the whole job" in found.symptom

def test_too_few_steps_are_not_judged():
    assert straggler.check(timeline(4, straggler.MIN_STEPS, late(1, 0.020))) == []
    assert straggler.check(timeline(4, straggler.MIN_STEPS + 1, late(1, 0.020)))


def test_a_slow_rank_seen_in_too_few_steps_to_be_sure_is_inconclusive():
    # 200 ms late at 2 steps of 14: the estimates pass, but a resample may hold neither
    found = straggler.check(timeline(4, 15, lambda r, n: 0.2 if r == 1 and n in (3, 9)
                                     else 0.0))
    assert [f.inconclusive for f in found] == [True]
    assert "(inconclusive)" in found[0].headline and "measure more steps" in found[0].symptom


def test_two_ranks_a_straggler_and_a_healthy_pair():
    assert [f.ranks for f in straggler.check(timeline(2, 40, late(0, 0.010)))] == [(0,)]
    rng = random.Random(7)
    jitter = {(r, n): rng.expovariate(1 / 0.004) for r in range(2) for n in range(60)}
    assert straggler.check(timeline(2, 60, noise=lambda r, n: jitter[r, n])) == []


def test_ddps_buckets_waited_together_count_once_and_blocking_calls_add_up():
    # two buckets: a rank 20 ms late is late at both, but the others wait 20 ms, not 40
    async_ = straggler.check(timeline(4, 40, late(1, 0.020), buckets=2))
    assert async_[0].measured["wait_share"] == pytest.approx(0.020 / step_seconds(0.020),
                                                             rel=1e-6)
    # blocking traced calls re-align the ranks: the delay shows at the first, once
    blocking = straggler.check(timeline(4, 40, late(1, 0.020), buckets=2, traced=True))
    assert blocking[0].ranks == (1,)
    assert blocking[0].measured["wait_share"] == pytest.approx(
        0.020 / (step_seconds(0.020) + SYNC), rel=1e-6)


def test_ranks_on_machines_apart_are_compared_in_wall_clock_time():
    # each rank's monotonic clock is off by hours; its wall-clock offset puts it right
    record = timeline(4, 40, late(2, 0.020), clock=lambda r: 3600.0 * r)
    assert [f.ranks for f in straggler.check(record)] == [(2,)]


def test_the_same_record_gives_the_same_verdict():
    record = timeline(4, 15, lambda r, n: 0.2 if r == 1 and n in (3, 9) else 0.0)
    assert straggler.check(record) == straggler.check(record)


def test_the_wait_after_a_fix_is_said_in_numbers():
    said = waiting(timeline(4, 40))
    assert said is not None and said.startswith("the costliest rank (")
    assert "holds the others up 0% of a 13.0 ms step" in said


def test_the_arrivals_picture_shades_each_wait_and_counts_who_came_last():
    from distdoctor.pictures import arrivals

    section = arrivals.picture(timeline(4, 20, late(1, 0.020)))
    assert section is not None and section.anchor == "arrivals"
    html = section.html
    # the last six steps: in each, rank 1 came last, and ranks 0, 2, 3 waited 20.0 ms
    assert html.count("waited 20.0 ms") == 6 * 3
    assert html.count('stroke="#c44e52"') == 6  # rank 1's arrival, marked last, each step
    assert "<td>1</td><td>19 of 19</td><td>20.0 ms</td>" in html
    assert arrivals.picture(timeline(4, 1)) is None  # nothing to judge: no picture


def test_an_undecided_straggler_is_said_as_such_and_the_run_stays_ok():
    from distdoctor.userjob.reporting.report import render, report

    record = timeline(4, 15, lambda r, n: 0.2 if r == 1 and n in (3, 9) else 0.0)
    said = report(record, tuple(straggler.check(record)), "train.py")
    assert (said.status, said.cause, said.findings) == ("ok", None, [])
    assert said.undecided[0].startswith("straggler (rank 1): rank 1 arrives last at ")
    text = render(said)
    assert text.startswith("distdoctor run: OK: all 4 ranks of train.py finished")
    assert "\n  not decided: straggler (rank 1): " in text
