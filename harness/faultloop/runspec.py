"""Run a spec on real ranks and assess the result: the forward path of the design.

A timing judgement that cannot decide (its confidence interval straddles its limit: see
``checks.unbalanced_stages``) is not settled by luck: the same spec runs again with twice, then
four times the steps, and only what is still undecided after that is reported as
inconclusive. A timing alarm one run raises stands only when a second run raises it too
(``run_decided``).
"""

from __future__ import annotations

import dataclasses

import torch

from distdoctor import checks
from distdoctor.analysis.distance import spreads
from distdoctor.analysis.votes import settled, until_settled
from distdoctor.launch.pool import RankPool, shared_pool
from distdoctor.models import Assessment, Finding, RankRecord, RunRecord, RunSpec, Verdict
from distdoctor.pipeline.train import pipeline_job
from distdoctor.tensor.train import tensor_job
from distdoctor.trace.evidence import evidence_from_events
from distdoctor.training.reference import compare, reference_params
from distdoctor.training.train import train_job


def run(spec: RunSpec, pool: RankPool | None = None) -> RunRecord:
    """Train ``spec`` on a warm pool of ``spec.world_size`` ranks and collect the record."""
    if pool is None:
        pool = shared_pool(spec.world_size, spec.backend)
    if pool.world_size != spec.world_size:
        raise ValueError(f"pool has {pool.world_size} ranks, the spec asks for {spec.world_size}")
    job = pipeline_job if spec.is_pipeline else tensor_job if spec.is_tensor else train_job
    result = pool.run(job, spec, deadline=spec.deadline)
    traces = result.traces or ((),) * len(result.ends)
    ranks = tuple(RankRecord(end.rank, end, evidence_from_events(end.rank, events, trace))
                  for end, events, trace in zip(result.ends, result.events, traces))
    return RunRecord(spec=spec, ranks=ranks, wall_s=result.wall_s,
                     torch_version=torch.__version__, started=result.started)


def assess(record: RunRecord) -> Assessment:
    """Every detector's findings, the spread between replicas, the distance from one process."""
    if record.spec.is_pipeline:
        from distdoctor.pipeline.reference import compare_pipeline, pipeline_reference

        reference = compare_pipeline(record, pipeline_reference(record.spec))
        spread = None  # pipeline ranks hold different stages: there are no replicas
    else:
        reference = compare(record, reference_params(record.spec))
        spread_per_step = spreads(record)
        spread = max(spread_per_step) if spread_per_step else None
    return Assessment(findings=checks.run_all(record), reference=reference,
                      param_spread=spread, ranks_finished=record.finished)


# the step multiples of the runs made while a timing judgement stays undecided: the spec as
# it is, then twice and four times its steps
STEP_MULTIPLES = (1, 2, 4)


def run_decided(spec: RunSpec, pool: RankPool | None = None) -> tuple[RunRecord, Assessment]:
    """``run`` and ``assess``; while a finished run leaves a timing judgement undecided, or
    holds a timing alarm not yet seen in a second run, run the spec again with more steps
    (the last record and its assessment are returned).

    Why a second run for an alarm: a run's steps share their neighbours on the machine, so
    a rank placed beside a busy process all run long (on a shared physical core its CPU
    time itself stretches) passes the per-step interval as clearly slow. A healthy 2-stage
    pipeline measured 1.31x under the suite's load and 1.05-1.1x on its own. Runs apart in
    time do not share that luck: an alarm stands when two runs raise it, and is dropped
    when two runs find none; one of each leaves it undecided, said as such."""
    def measure(attempt: int) -> tuple[RunRecord, Assessment]:
        steps = spec.num_steps * STEP_MULTIPLES[attempt]
        record = run(dataclasses.replace(spec, num_steps=steps), pool)
        return record, assess(record)

    (record, assessment), said = until_settled(
        measure, lambda done: timing_alarm(done[1]), lambda done: done[0].finished,
        most=len(STEP_MULTIPLES))
    if record.finished and not assessment.undecided and not settled(said):
        assessment = unconfirmed(assessment, said)
    return record, assessment


def timing_alarm(assessment: Assessment) -> tuple[Finding, ...] | None:
    """The decided findings of the checks that judge time from one run (``checks``:
    ``CONFIRMED_BY_A_SECOND_RUN``); None while any timing judgement is undecided (the run
    is no vote: more steps are measured)."""
    if assessment.undecided:
        return None
    return tuple(f for f in assessment.findings if checks.confirmed_by_a_second_run(f.check))


def unconfirmed(assessment: Assessment, said: list[tuple[Finding, ...] | None]) -> Assessment:
    """The last run's assessment with its timing verdict left undecided: the runs split."""
    alarm = next(s for s in reversed(said) if s)
    alarms, quiet = sum(1 for s in said if s), sum(1 for s in said if s == ())
    split = f" (raised in {alarms} of {alarms + quiet} runs, not in the others)"
    kept = [f for f in assessment.findings if f not in alarm and
            not checks.confirmed_by_a_second_run(f.check)]
    undecided = [dataclasses.replace(f, inconclusive=True, headline=f.headline + split)
                 for f in alarm]
    return dataclasses.replace(assessment, findings=(*kept, *undecided))


def judge(record: RunRecord, assessment: Assessment | None = None) -> Verdict:
    """The verdict on a single run: healthy, unhealthy, or inconclusive when the only thing
    against it is an undecided timing judgement."""
    assessment = assessment or assess(record)
    if not assessment.decided_health:
        return Verdict("inconclusive", assessment, note=undecided_note(assessment))
    return Verdict("healthy" if assessment.healthy else "unhealthy", assessment)


def undecided_note(assessment: Assessment) -> str:
    return "undecided after measuring more: " + "; ".join(
        f"{f.check}: {f.headline}" for f in assessment.undecided)
