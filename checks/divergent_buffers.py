"""Do the replicas hold one state beyond their parameters? Their buffers (BatchNorm's
running statistics, any registered floating-point buffer), as each training forward
begins.

Ranks one DistributedDataParallel wraps are replicas. DDP broadcasts rank 0's buffers at
each forward by default, so there they agree; with ``broadcast_buffers=False`` and no
SyncBatchNorm each rank keeps statistics of its own batches, and the model each rank
would evaluate or save differs. The first sampled step at which they differ, which
buffers, which ranks, and the spread.
"""

from __future__ import annotations

from distdoctor.checks import one_ddp, replica_parts
from distdoctor.models import Finding, RunRecord
from distdoctor.models.calls import ranks_phrase, relative_line

NAME = "divergent_buffers"
TOLERANCE = 1e-6  # relative to the values' size


def check(record: RunRecord) -> list[Finding]:
    """Within each replica group (a DDP per replicate group: HSDP's shape)."""
    return [f for part in replica_parts(record) for f in _check(part)][:1]


def _check(record: RunRecord) -> list[Finding]:
    if len(record.ranks) < 2 or not one_ddp(record):
        return []
    by_step = [{b.step: b for b in r.evidence.buffers} for r in record.ranks]
    common = sorted(set.intersection(*(set(s) for s in by_step))) if by_step else []
    for step in common:
        samples = [s[step] for s in by_step]
        if len({(b.names, tuple(map(len, b.values))) for b in samples}) != 1:
            continue  # not the same model on every rank: nothing to compare
        parted, spread = [], 0.0
        for index, name in enumerate(samples[0].names):
            for column in zip(*(b.values[index] for b in samples)):
                gap = max(column) - min(column)
                if gap > TOLERANCE * max(1.0, max(abs(v) for v in column)):
                    parted.append(name)
                    spread = max(spread, gap)
                    break
        if not parted:
            continue
        differ = [r.rank for r, b in zip(record.ranks, samples)
                  if b.values != samples[0].values]
        where = relative_line(samples[0].where) if samples[0].where else ""
        return [Finding(
            check=NAME, fault="divergent-buffers", kind="divergent-buffers",
            headline=f"buffers differ from step {step}",
            symptom=f"the replicas' buffers differ as the forward of optimiser step {step} "
                    f"begins ({', '.join(parted)}): spread {spread:.3g}; "
                    f"{ranks_phrase(differ)} {'differs' if len(differ) == 1 else 'differ'} "
                    f"from rank 0, so the model each rank would evaluate or save differs",
            cause="buffers that are never synchronised: DDP was built with "
                  "broadcast_buffers=False, and no SyncBatchNorm averages the statistics",
            fix="convert the model's BatchNorm layers with "
                "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before wrapping it, or "
                "leave DDP's broadcast_buffers=True (its default); until then evaluate and "
                "save from one rank's model only",
            fix_changes={}, ranks=tuple(differ), first_step=step,
            where=(where,) if where else (),
            measured={"first_step": step, "buffers": parted, "spread": spread,
                      "ranks_differing_from_rank_0": differ})]
    return []
