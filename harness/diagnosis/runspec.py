"""Run a spec on real ranks and assess the result: the forward path of the design."""

from __future__ import annotations

import torch

import checks
from harness.trace.evidence import evidence_from_events
from harness.models import Assessment, RankRecord, RunRecord, RunSpec, Verdict
from harness.pipeline.train import pipeline_job
from harness.launch.pool import RankPool, shared_pool
from harness.models.distance import spreads
from harness.training.reference import compare, reference_params
from harness.training.train import train_job


def run(spec: RunSpec, pool: RankPool | None = None) -> RunRecord:
    """Train ``spec`` on a warm pool of ``spec.world_size`` ranks and collect the record."""
    if pool is None:
        pool = shared_pool(spec.world_size, spec.backend)
    if pool.world_size != spec.world_size:
        raise ValueError(f"pool has {pool.world_size} ranks, the spec asks for {spec.world_size}")
    job = pipeline_job if spec.is_pipeline else train_job
    result = pool.run(job, spec, deadline=spec.deadline)
    traces = result.traces or ((),) * len(result.ends)
    ranks = tuple(RankRecord(end.rank, end, evidence_from_events(end.rank, events, trace))
                  for end, events, trace in zip(result.ends, result.events, traces))
    return RunRecord(spec=spec, ranks=ranks, wall_s=result.wall_s,
                     torch_version=torch.__version__, started=result.started)


def assess(record: RunRecord) -> Assessment:
    """Every detector's findings, the spread between replicas, the distance from one process."""
    if record.spec.is_pipeline:
        from harness.pipeline.reference import compare_pipeline, pipeline_reference

        reference = compare_pipeline(record, pipeline_reference(record.spec))
        spread = None  # pipeline ranks hold different stages: there are no replicas
    else:
        reference = compare(record, reference_params(record.spec))
        spread_per_step = spreads(record)
        spread = max(spread_per_step) if spread_per_step else None
    return Assessment(findings=checks.run_all(record), reference=reference,
                      param_spread=spread, ranks_finished=record.finished)


def judge(record: RunRecord) -> Verdict:
    """The verdict on a single run: healthy or not."""
    assessment = assess(record)
    return Verdict("healthy" if assessment.healthy else "unhealthy", assessment)
