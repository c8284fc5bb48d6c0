"""Every fault x variant x strategy it shows on x world sizes 2 and 4, on warm pools.

Each case injects the fault, lets the detectors find it from evidence, applies the fix the
findings carry and checks the fixed run against the single-process reference. The numbers
the findings report are checked against values the test works out on its own.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path

import pytest
import torch

from distdoctor import checks, faults
from distdoctor.faultloop.diagnose import diagnose
from distdoctor.faultloop.runspec import run, run_decided
from distdoctor.launch.watch import PROVEN
from distdoctor.models import Knobs, RunSpec
from distdoctor.models.verdict import CAUSE_KINDS
from distdoctor.pipeline import PIPELINE_STRATEGIES
from distdoctor.training.workload import MLP, STRAGGLER_S

CASES = [(fault.id, variant.name, strategy, world_size)
         for fault in faults.catalogue().values()
         for variant in fault.variants
         for strategy in fault.strategies if fault.detectable_on(strategy)
         for world_size in (2, 4) if world_size >= fault.min_world_size]
# generous for slow first steps under load, and never what ends a case: every hang in the
# matrix must be proven from the calls (ZeroRedundancyOptimizer with a skipped head: DDP's
# all-reduce, waited on from C++, meets its broadcast; the Flight Recorder shows it)
DEADLINE = 60.0
MODEL = MLP(8, 16)
PARAM_BYTES = 4 * sum(p.numel() for p in MODEL.parameters())
LAYERS = [sum(p.numel() for p in m.parameters(recurse=False)) for m in MODEL.children()]
PER_LAYER = ("zero3", "fsdp2", "fsdp2-grad-op")  # a collective per layer (ZeRO-1/2: a bucket)
ADAM = ("zero1", "zero2", "zero3", "torch-zero", "fsdp2", "fsdp2-grad-op")


def sync_bytes(strategy: str, n: int) -> int:
    """Bytes one synchronisation of every gradient moves: the flat layer buffers padded to a
    multiple of N (hand-rolled ZeRO), every parameter's rows padded to a multiple of N
    (FSDP2), or the gradients as they are (DDP's buckets)."""
    if strategy.startswith("zero"):
        return 4 * sum(math.ceil(k / n) * n for k in LAYERS)
    if strategy.startswith("fsdp2"):
        return 4 * sum(math.ceil(p.shape[0] / n) * n * p[0].numel() for p in MODEL.parameters())
    return PARAM_BYTES


def expected_numbers(fault_id: str, variant: str, world_size: int, spec: RunSpec, finding,
                     record=None) -> None:
    measured = finding.measured
    if fault_id == "divergent-init":
        models = [dict(_built(spec.seed + r).named_parameters()) for r in range(world_size)]
        spread = max(float((torch.stack([m[name] for m in models]).amax(0)
                            - torch.stack([m[name] for m in models]).amin(0)).max())
                     for name in models[0])
        assert measured["first_divergent_step"] == 0
        assert measured["ranks_differing_from_rank_0"] == list(range(1, world_size))
        assert measured["spread_per_step"][0] == pytest.approx(spread, abs=1e-6)
    elif (fault_id, variant) == ("shared-shuffle-seed", "same-seed"):
        assert set(measured["overlap_share_per_epoch"].values()) == {1.0}
    elif fault_id == "shared-shuffle-seed":
        epochs = math.ceil(spec.num_steps / spec.steps_per_epoch)
        assert measured["replayed_epochs"] == list(range(1, epochs))
    elif fault_id == "unused-params":
        skipping = range(world_size) if variant == "all-ranks" else range(1, world_size, 2)
        assert measured["step"] == 1
        assert measured["no_grad_params"] == {str(r): ["aux.weight", "aux.bias"] for r in skipping}
    elif fault_id == "sum-without-mean":
        assert measured["ratio"] == pytest.approx(world_size, abs=1e-3)
        assert all(r == pytest.approx(world_size, abs=1e-3) for r in measured["ratio_per_step"])
    elif fault_id == "allreduce-every-microbatch":
        per_sync = len(LAYERS) if spec.strategy in PER_LAYER else 1
        assert (measured["allreduces_per_step"], measured["wasted_share"]) == (4 * per_sync, 0.75)
        assert measured["minimum_bytes_per_step"] == sync_bytes(spec.strategy, world_size)
        assert measured["bytes_per_step"] == 4 * sync_bytes(spec.strategy, world_size)
    elif fault_id == "over-memory-budget":
        padded = sync_bytes("zero1", world_size) // 4
        held = 4 * padded + 4 * padded + 8 * padded // world_size + 4 * len(LAYERS)
        assert measured["budget_bytes"] == 8 * PARAM_BYTES // 4
        assert measured["bytes_per_rank"] == {str(r): held for r in range(world_size)}
        # ZeRO-2 on 4 ranks is the cheapest fit: on 2 ranks no stage fits
        assert (measured["planned"]["stage"], measured["planned"]["world_size"]) == (2, 4)
        assert finding.fix_changes == {"strategy": "zero2", **(
            {"world_size": 4} if world_size == 2 else {})}
    elif fault_id == "send-before-receive":
        # 1F1B's last stage has no warm-up, so it and its neighbour exchange first
        assert measured["cycle"] == [world_size - 2, world_size - 1]
        blocked = measured["blocked_in"]
        assert len(blocked) == world_size
        assert all(text.startswith("send to ") for text in blocked.values())
        lines = {text.rsplit(":", 1)[1] for text in blocked.values()}
        assert len(lines) == 1  # every rank is blocked at the same line, and it is a send
        assert "dist.send(" in HANDROLLED.read_text().splitlines()[int(lines.pop()) - 1]
    elif fault_id == "unbalanced-stages":
        # cut at equal parameter counts: equal layer counts; FLOPs per layer by formula
        layers, per_stage = spec.pipe.layers, len(spec.pipe.layers) // world_size
        tokens, d, t = spec.batch_size // spec.micro_batches * spec.pipe.seq_len, \
            spec.pipe.d_model, spec.pipe.seq_len
        flops = {"m": 3 * 8 * tokens * d * d, "a": 3 * (8 * tokens * d * d + 4 * tokens * t * d)}
        stage = [sum(flops[k] for k in layers[i * per_stage:(i + 1) * per_stage])
                 for i in range(world_size)]
        mean = sum(stage) / world_size
        heaviest = [i for i in range(world_size) if stage[i] == max(stage)]
        assert heaviest == [i for i in range(world_size) if "a" in layers[i * per_stage]]
        assert measured["slowest_rank"] in heaviest  # a rank holding only attention blocks
        assert measured["max_over_mean_flops"] == pytest.approx(max(stage) / mean)
        # the time ratio, summed here from the ranks' own stage events over the steps
        # every rank completed: the slowest rank's CPU time over the mean, step by step
        ratios = time_ratios(record, measured["slowest_rank"])
        assert measured["steps_judged"] == len(ratios)
        assert measured["max_over_mean_time"] == pytest.approx(statistics.fmean(ratios))
    elif fault_id == "straggler":
        judged = spec.num_steps - 1  # the first step, start-up, is never judged
        assert (measured["straggler_rank"], measured["steps_judged"]) == (1, judged)
        # 20 ms late at every step of a few ms: last at (nearly) every one
        assert measured["last_in_steps"] >= judged - 2
        # the knob's delay is a sleep, or work until that much time has passed; the others
        # compute meanwhile (sharing the cores) and rank 1 after it, alone and faster, so
        # it arrives the delay later less that difference: more than half of it. Where the
        # delay is work, it takes a core the others' compute needs (4 ranks on 2 cores),
        # and the suite's own load stretches that compute further: a quarter of it (the
        # suite once measured a median of 9.95 ms of 20 there)
        delay_ms = STRAGGLER_S * 1e3
        least = (0.25 if variant == "extra-work" else 0.5) * delay_ms
        assert measured["late_ms_quartiles"][1] >= least
        assert measured["wait_share"] >= least / measured["step_ms"]
        assert measured["wait_share_interval"][0] >= 0.10
        assert ("waiting for its data loader's next batch" if variant == "slow-loader"
                else "its own code") in finding.symptom.split("Where its time goes: ")[1]
    elif fault_id in RESUME_FAULTS:
        resume_numbers(fault_id, variant, world_size, spec, measured)
    elif fault_id in TENSOR_NUMBERS:
        TENSOR_NUMBERS[fault_id](variant, spec, measured)
    else:
        raise AssertionError(f"no expected numbers for {fault_id}")


from tensor_numbers import TENSOR_NUMBERS  # noqa: E402

RESUME_FAULTS = ("rng-state-not-restored", "scheduler-not-restored", "sampler-not-restored",
                 "optimizer-state-not-restored", "shards-not-restored")


def resume_numbers(fault_id: str, variant: str, world_size: int, spec: RunSpec,
                   measured: dict) -> None:
    """The restart is after the scenario's step; what each fault loses, worked out here."""
    step = faults.RESTART_AFTER
    assert spec.knobs.restart_after == step and measured["restart_after_step"] == step
    everyone = list(range(world_size))
    if fault_id == "rng-state-not-restored":
        # one key for every rank: DCP writes one rank's RNG state, and all read it
        (source,) = set(measured["resumed_with"].values())
        assert measured["ranks_not_restored"] == [r for r in everyone if r != source]
        assert sorted(map(int, measured["resumed_with"])) == measured["ranks_not_restored"]
    elif fault_id == "scheduler-not-restored":
        assert (measured["scheduler_steps_saved"], measured["scheduler_steps_restored"]) == \
            (step, 0)
    elif fault_id == "sampler-not-restored":
        per_epoch = spec.num_samples // (world_size * spec.batch_size)
        saved = {"epoch": step // per_epoch, "batch": step % per_epoch}
        assert saved["batch"] > 0  # mid-epoch, where a lost place shows
        assert measured["saved"] == saved
        assert measured["restored"] == ({"epoch": saved["epoch"], "batch": 0}
                                        if variant == "position-lost"
                                        else {"epoch": 0, "batch": 0})
    elif fault_id == "optimizer-state-not-restored":
        assert (measured["ranks_restored"], measured["ranks_not_restored"]) == \
            ([0], everyone[1:])
    else:  # one copy per key of shards that differ: at most one rank reads its own back
        assert set(measured["ranks_not_restored"]) <= set(everyone)
        assert len(measured["ranks_not_restored"]) >= world_size - 1
        assert measured["parts_lost"] == ["parameters", "optimizer state"]

pytestmark = pytest.mark.tier("warm")

HANDROLLED = Path(__file__).parent.parent / "harness" / "pipeline" / "handrolled.py"


def time_ratios(record, rank: int) -> list[float]:
    """Per step that every rank completed: ``rank``'s compute CPU time over the mean."""
    complete = set.intersection(*({s.step for s in r.evidence.pipe_steps}
                                  for r in record.ranks))
    cpu = {r.rank: {n: sum(e.cpu for e in r.evidence.stage_events if e.step == n)
                    for n in complete} for r in record.ranks}
    return [cpu[rank][n] / statistics.fmean(c[n] for c in cpu.values()) for n in complete]


def _built(seed: int) -> MLP:
    torch.manual_seed(seed)
    return MLP(8, 16).requires_grad_(False)


@pytest.fixture(scope="module")
def run_fixed():
    """``run_decided``, once per spec: many faults' fixes arrive at the same spec (the clean
    run of their strategy), and a spec's run is the same run whichever fault led to it, so
    each is run once and its record and assessment shared (a third of the module's jobs)."""
    done: dict[RunSpec, tuple] = {}

    def runner(spec: RunSpec, pool):
        if spec not in done:
            done[spec] = run_decided(spec, pool)
        return done[spec]

    return runner


# a straggler's and a stage balance's verdicts judge times: those cases run last, on a
# machine the background lanes no longer load (conftest.py); a straggler's fixed run is
# measured afresh. Beside the lanes, a 2-stage pipe-1f1b was once left undecided.
@pytest.mark.parametrize("fault_id, variant, strategy, world_size", [
    pytest.param(*case, marks=[pytest.mark.timing] if checks.judges_time(case[0]) else [])
    for case in CASES])
def test_fault_is_detected_with_its_numbers_and_the_fix_verified(pools, run_fixed, fault_id,
                                                                 variant, strategy, world_size):
    fault = faults.get(fault_id)
    deadline = DEADLINE
    report = diagnose(fault, RunSpec(strategy=strategy, world_size=world_size,
                                     deadline=deadline), variant, pools(world_size),
                      run_decided if fault_id == "straggler" else run_fixed)
    verdict = report.verdict
    hung = [r.end for r in report.record.ranks if r.end.status == "hung"]
    assert all(e.error.startswith(PROVEN) for e in hung), [e.error for e in hung]
    ours = [f for f in verdict.before.findings if f.fault == fault_id]
    assert len(ours) == 1, [f.headline for f in verdict.before.findings]
    # the cause a user's run is told is the fault's own name, or the broader kind the
    # catalogue says covers it (tests/test_names.py); nothing for the built-in-only ones
    told = tuple(kind for kind in fault.reported_as if kind in CAUSE_KINDS)
    assert ours[0].kind in (told or ("",)), ours[0].kind
    expected_numbers(fault_id, variant, world_size, report.record.spec, ours[0], report.record)
    if verdict.outcome == "inconclusive" and verdict.after is not None and \
            checks.judges_time(fault_id):
        # the fixed run's times stayed undecided after measuring more (seen once in CI: a
        # time-cut 2-stage pipeline's rank 1 at 1.33x the mean, its interval across the
        # limit, on a machine busier than ours): the tool said so, as a time near its
        # limit must be said; what it must never do is call the fix wrong
        assert not decided(verdict.after.findings), verdict.note
        assert all(f.check == ours[0].check for f in verdict.after.findings), verdict.note
    else:
        assert verdict.outcome == "fixed", verdict.note
        assert verdict.after.findings == ()
    if fault_id in CLEAN_AFTER_FIX:  # the clean run of its strategy, so not run again below
        clean = fault.scenario(RunSpec(strategy=strategy, world_size=world_size,
                                       deadline=deadline, **CLEAN_AFTER_FIX[fault_id]))
        fixed = report.fixed_record.spec  # a timing judgement may have measured more steps
        assert dataclasses.replace(fixed, num_steps=clean.num_steps) == clean
        assert fixed.num_steps % clean.num_steps == 0
    assert verdict.after.ranks_finished
    assert verdict.after.param_spread is None or verdict.after.param_spread <= 1e-6
    assert verdict.after.reference.max_abs_diff <= 1e-5
    if fault_id in ("allreduce-every-microbatch", "unbalanced-stages", "tp-across-nodes",
                    "straggler"):
        assert verdict.before.reference.matches  # these cost time, not correctness
    elif fault_id == "sum-without-mean" and strategy in ADAM:
        # Adam divides by the gradient's own scale: N times the gradient barely moves it
        assert not verdict.before.healthy and verdict.before.reference.max_abs_diff < 1e-5
    else:
        assert not verdict.before.healthy and not verdict.before.reference.matches
    # the detectors read evidence, not knobs: the same findings with the knobs wiped
    wiped = dataclasses.replace(report.record,
                                spec=dataclasses.replace(report.record.spec, knobs=Knobs()))
    assert checks.run_all(wiped) == verdict.before.findings


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("strategy", ["torch-ddp", "torch-zero"])
def test_torch_ddp_masks_divergent_init_and_the_run_shows_it(pools, world_size, strategy):
    report = diagnose(faults.get("divergent-init"),
                      RunSpec(strategy=strategy, world_size=world_size), None, pools(world_size))
    assert report.verdict.outcome == "masked" and report.verdict.before.findings == ()
    built = [r.evidence.built_params for r in report.record.ranks]
    initial = [r.evidence.initial_params for r in report.record.ranks]
    assert len({p.digest for p in built}) == world_size  # every rank built its own model
    assert len({p.digest for p in initial}) == 1  # and DDP's construction made them one
    assert "as built" in report.verdict.note


def test_a_fault_that_cannot_show_is_not_reproduced_rather_than_fixed(pools):
    report = diagnose(faults.get("unused-params"), RunSpec(world_size=1), "some-ranks", pools(1))
    assert report.verdict.outcome == "not-reproduced" and not report.verdict.passed
    assert report.fixed_record is None


CLEAN = {
    "default": {},
    "accumulation": {"micro_batches": 4},
    "aux-skipped-handled": {"knobs": Knobs(aux_skipped_on="odd-ranks",
                                           find_unused_parameters=True)},
    "three-epochs": {"num_steps": 24},
}


def decided(found) -> list:
    """The findings that are verdicts: all but a timing check's undecided ones, which a
    clean run on a machine shared by more ranks than cores may get, said as undecided (a
    time near its limit, or a rank whose CPU was taken by other work), never a verdict."""
    return [f for f in found if not (f.inconclusive and checks.judges_time(f.check))]


@pytest.mark.parametrize("config", list(CLEAN))
@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("strategy", ["ddp", "torch-ddp"])
def test_clean_runs_give_no_finding_from_any_detector(pools, strategy, world_size, config):
    record = run(RunSpec(strategy=strategy, world_size=world_size, **CLEAN[config]),
                 pools(world_size))
    assert record.finished
    for detector in checks.detectors():
        assert decided(detector.check(record)) == [], detector.__name__
    # each detector (one a file of checks/) ran on these clean runs, and was quiet
    assert len(checks.detectors()) == len(list(Path(checks.__file__).parent.glob("[a-z]*.py")))


# The default and accumulation clean runs of every sharded strategy are the fixed runs of
# sum-without-mean and allreduce-every-microbatch above, and the clean pipelines of the
# schedules unbalanced-stages shows on are its fixed runs (the matrix checks their specs
# are exactly those), judged there by every detector; only what no fix produces is run here.
CLEAN_SHARDED = {"budget-that-fits": {"knobs": Knobs(memory_budget=24.0)}}
CLEAN_AFTER_FIX = {"sum-without-mean": {}, "allreduce-every-microbatch": {"micro_batches": 4},
                   "unbalanced-stages": {}}


@pytest.mark.parametrize("config", list(CLEAN_SHARDED))
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("strategy", ADAM)
def test_clean_sharded_runs_give_no_finding(pools, strategy, world_size, config):
    record = run(RunSpec(strategy=strategy, world_size=world_size, **CLEAN_SHARDED[config]),
                 pools(world_size))
    assert record.finished
    assert decided(checks.run_all(record)) == []


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "torch-zero"])
def test_sharded_runs_that_handle_skipped_params_give_no_finding(pools, strategy):
    spec = RunSpec(strategy=strategy, world_size=4, **CLEAN["aux-skipped-handled"])
    record = run(spec, pools(4))
    assert record.finished and decided(checks.run_all(record)) == []


def test_over_budget_zero2_on_two_ranks_is_fixed_with_more_ranks(pools):
    """ZeRO-2 is the highest stage that helps this model (ZeRO-3 gathers a layer of 60% of
    it), so on 2 ranks the fix keeps the stage and doubles the ranks."""
    report = diagnose(faults.get("over-memory-budget"), RunSpec(strategy="zero2", world_size=2),
                      None, pools(2))
    (found,) = report.verdict.before.findings
    assert found.fix_changes == {"world_size": 4}
    assert report.verdict.outcome == "fixed"
    after = [r.evidence.memory[-1] for r in report.fixed_record.ranks]
    assert len(after) == 4 and all(m.total <= m.budget for m in after)


def test_every_data_parallel_fault_says_where_it_applies():
    """Each data-parallel fault names every data-parallel strategy as applying, or says why
    it does not apply to it."""
    from distdoctor.training.strategies import STRATEGIES

    for fault in faults.catalogue().values():
        if not set(fault.strategies) & set(STRATEGIES):
            continue
        for strategy in STRATEGIES:
            assert strategy in fault.strategies or strategy in fault.excluded, \
                (fault.id, strategy)


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("strategy", [s for s in PIPELINE_STRATEGIES
                                      if s not in faults.get("unbalanced-stages").strategies])
def test_clean_pipelines_give_no_finding_from_any_detector(pools, strategy, world_size):
    """The unbalanced-stages workload cut by time: heavy enough to be judged, and even once
    enough steps are measured (the same path every verdict takes). On the schedules the
    fault shows on, this run is its fixed run, judged in the matrix above."""
    spec = faults.get("unbalanced-stages").scenario(RunSpec(strategy=strategy,
                                                            world_size=world_size))
    record, assessment = run_decided(spec, pools(world_size))
    assert record.finished and spec.knobs.stage_split == "time"
    assert assessment.findings == (), [f.headline for f in assessment.findings]
