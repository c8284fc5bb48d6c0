"""``assert_trains_like_one_process``: a user's data-parallel training against the same
code on one process, step by step, with the cause named when they part.

Data parallelism is correct when N ranks, each training on 1/N of every global batch,
end every step with the parameters one process gets from the whole batch. So the user's
own ``build`` and ``step`` run twice on the same global batches: on N ranks (each a
contiguous 1/N of each batch) and on one rank (all of it; there a sum over ranks is the
mean, and a model is its own replica). Both run on pools whose ranks record what
``distdoctor run`` records, so when a rank parts, the same detectors read the evidence
and say why: gradients summed and not averaged, replicas built apart, parameters that
got no gradient, ...
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from distdoctor.models import deadlines
from distdoctor.testing.same import compare_entry


def assert_trains_like_one_process(build: Callable[[], tuple[Any, Any]],
                                   step: Callable[[Any, Any, Any], Any], batches: list,
                                   *, world_size: int, atol: float = 1e-5,
                                   rtol: float = 1e-4,
                                   deadline: float = deadlines.USER_JOB_S) -> None:
    """``build()`` -> (model, optimizer) and ``step(model, optimizer, batch)`` are module-
    level functions of the user's (``model`` may be a DDP wrapper). ``batches``: global
    batches, each a tensor or a tuple/list/dict of tensors whose first dimension divides
    by ``world_size``. Raises RankFailure naming the first step and rank that parts from
    one process, and the cause the detectors find; a crash or hang is named as in
    ``distdoctor run``."""
    __tracebackhide__ = True
    from distdoctor.testing.ranks import cut, judge_job, run_on, sendable

    deadline = cut(deadline)
    sendable((build, step), "build and step", "pass functions defined at module level")
    sendable(batches, "the batches")
    for index, batch in enumerate(batches):
        for tensor in _tensors(batch):
            if tensor.shape[0] % world_size:
                raise ValueError(f"batch {index} has {tensor.shape[0]} rows, which "
                                 f"{world_size} ranks cannot share equally")
    from distdoctor.testing.onrank import call

    job: tuple[Callable, tuple, dict] = (_train, (build, step, batches), {})
    many = run_on(world_size, deadline, call, *job, evidence=True)
    outcome = judge_job(many, deadline, "the training on ranks")
    if outcome.status != "passed":
        raise outcome.failure()
    one = run_on(1, deadline, call, *job, evidence=True)
    outcome = judge_job(one, deadline, "the training on one process")
    if outcome.status != "passed":
        raise AssertionError("the one-process reference failed, so there is nothing to "
                             f"compare with:\n{outcome.text}")
    reference = one.values[0][0]
    for at in range(len(reference)):
        parted = {rank: detail for rank, (snapshots, _) in enumerate(many.values)
                  for detail in [_parting(reference[at], snapshots[at], atol, rtol)]
                  if detail}
        if parted:
            raise _explained(many, at, parted, world_size, deadline, (build, step))


def _train(build, step, batches) -> list[dict[str, torch.Tensor]]:
    """On each rank: the parameters after build, then after each step on its shard."""
    import torch.distributed as dist

    model, optimizer = build()
    snapshots = [_params(model)]
    for batch in batches:
        step(model, optimizer, _shard(batch, dist.get_rank(), dist.get_world_size()))
        snapshots.append(_params(model))
    return snapshots


def _params(model) -> dict[str, torch.Tensor]:
    inner = getattr(model, "module", model)
    return {name: p.detach().cpu().clone() for name, p in inner.named_parameters()}


def _shard(batch, rank: int, n: int):
    if isinstance(batch, torch.Tensor):
        return batch.chunk(n)[rank] if n > 1 else batch
    if isinstance(batch, dict):
        return {key: _shard(value, rank, n) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_shard(value, rank, n) for value in batch)
    return batch


def _tensors(batch) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    values = batch.values() if isinstance(batch, dict) else \
        batch if isinstance(batch, (list, tuple)) else ()
    return [t for value in values for t in _tensors(value)]


def _parting(reference: dict, mine: dict, atol: float, rtol: float) -> str | None:
    """The first parameter of ``mine`` that differs from one process, and by how much."""
    for name in reference:
        detail = compare_entry(reference, mine, name, atol, rtol)
        if detail:
            return f"param {name}: {detail}"
    return None


def _batch_norm(record) -> bool:
    """Did the ranks' DDP model sample BatchNorm running statistics (trace/buffers.py)?"""
    return any(name.endswith("running_mean") for rank in record.ranks
               for sample in rank.evidence.buffers for name in sample.names)


def _explained(result, at: int, parted: dict[int, str], n: int, deadline: float,
               functions: tuple[Callable, ...]):
    from distdoctor.models.calls import ranks_phrase
    from distdoctor.testing.verdict import RankFailure, relative_paths
    from distdoctor.userjob.reporting.record import explain, script_record
    from distdoctor.userjob.reporting.report import look_at

    when = "after build, before any step" if at == 0 else f"after step {at}"
    lines = [f"{ranks_phrase(sorted(parted))} of {n} part{'s' if len(parted) == 1 else ''} "
             f"from one process {when}:"]
    lines += [f"  rank {rank}: {detail}" for rank, detail in sorted(parted.items())]
    record = script_record(result.ends, result.traces, result.wall_s, result.started,
                           deadline)
    report = explain(record, "the training")
    for cause in report.findings:
        lines += [f"cause: {cause.kind} ({ranks_phrase(cause.ranks)}): {cause.summary}",
                  f"  fix: {cause.fix}"]
    places = look_at(report)
    if places:
        lines.append("  look at: " + ", ".join(places))
    if not report.findings and _batch_norm(record):
        lines.append("no detector named a cause, and the model has BatchNorm layers: each "
                     "rank normalises its own share of the batch, one process all of it, "
                     "so the two part by design (SyncBatchNorm normalises over the ranks); "
                     "compare a model without them, or with a tolerance")
    elif not report.findings:
        lines.append("no detector named a cause: compare the step's gradient averaging, "
                     "initial parameters and data split by hand")
    lines += _suggested_edit(report.findings, functions)
    kind = report.findings[0].kind if report.findings else "differs"
    ranks = tuple(report.findings[0].ranks) if report.findings else tuple(sorted(parted))
    return RankFailure(kind, ranks, relative_paths("\n".join(lines)))


def _suggested_edit(findings, functions: tuple[Callable, ...]) -> list[str]:
    """The edit ``distdoctor run --fix`` would make for the causes, shown when it changes
    only the lines of the user's own ``build`` or ``step`` (a remedy that would edit some
    other function of the file is not offered: nothing here re-runs it to check)."""
    import inspect
    import os
    from pathlib import Path

    from distdoctor.fixing.patches import Finding, propose

    try:
        spans = [(inspect.getsourcefile(f), *_span(f)) for f in functions]
    except (OSError, TypeError):  # (a function without source: a builtin, a lambda's REPL)
        return []
    files = {file for file, _, _ in spans if file}
    if len(files) != 1:
        return []
    script = Path(files.pop()).resolve()
    proposal, _ = propose([Finding.of(c) for c in findings], script, Path.cwd())
    if proposal is None:
        return []
    diff = proposal.diff(os.path.relpath(script))
    if not all(any(first <= line <= last for _, first, last in spans)
               for line in _changed_lines(proposal.before, proposal.after)):
        return []
    return [f"suggested edit ({', '.join(proposal.cures)}; the remedy distdoctor run --fix "
            f"makes, not re-run here: apply it and run the test again):", diff.rstrip("\n")]


def _span(function: Callable) -> tuple[int, int]:
    import inspect

    source, first = inspect.getsourcelines(function)
    return first, first + len(source) - 1


def _changed_lines(before: str, after: str) -> list[int]:
    """The original's lines (1-based) an edit removes or replaces, or after which it adds."""
    import difflib

    blocks = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines(),
                                     autojunk=False).get_opcodes()
    return [line for tag, start, end, _, _ in blocks if tag != "equal"
            for line in (range(start + 1, end + 1) if end > start else [max(start, 1)])]
