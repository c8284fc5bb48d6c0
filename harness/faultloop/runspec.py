"""Run a spec on real ranks and assess the result: the forward path of the design.

A timing judgement that cannot decide (its confidence interval straddles its limit: see
``checks.unbalanced_stages``) is not settled by luck: the same spec runs again with twice, then
four times the steps, and only what is still undecided after that is reported as
inconclusive.
"""

from __future__ import annotations

import dataclasses

import torch

from distdoctor import checks
from distdoctor.analysis.distance import spreads
from distdoctor.launch.pool import RankPool, shared_pool
from distdoctor.models import Assessment, RankRecord, RunRecord, RunSpec, Verdict
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


MORE_STEPS = (2, 4)  # step multiples tried while a timing judgement stays undecided


def run_decided(spec: RunSpec, pool: RankPool | None = None) -> tuple[RunRecord, Assessment]:
    """``run`` and ``assess``; while a finished run leaves a timing judgement undecided, run
    the spec again with more steps (the last record and its assessment are returned)."""
    record = run(spec, pool)
    assessment = assess(record)
    for factor in MORE_STEPS:
        if not (assessment.undecided and record.finished):
            break
        record = run(dataclasses.replace(spec, num_steps=spec.num_steps * factor), pool)
        assessment = assess(record)
    return record, assessment


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
