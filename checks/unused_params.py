"""Parameters that got no gradient, named per rank, caught at the step they first occur.

Ranks record which parameters got no gradient before their first gradient sync of the
step, so the evidence reaches home even when that sync hangs or kills the run. Missing
gradients are fine when the sync coped (every rank finished the step, issued an
all-reduce and applied the same gradient, as with find_unused_parameters=True); any
other outcome is reported with what went wrong.

A user's run under torch DDP without find_unused_parameters records no such thing; DDP
itself raises "Expected to have finished reduction in the prior iteration" on the step
after, listing the parameters by index ("Parameter indices which did not receive grad for
rank 1: 2 3"; names only under TORCH_DISTRIBUTED_DEBUG). Ranks run by distdoctor record
their DDP's parameter names in the reducer's order, so indices become names on every rank
that raised. That error is read only when the earlier, better evidence is absent.
"""

from __future__ import annotations

import re

from distdoctor.checks import finding
from distdoctor.models import Finding, RunRecord
from distdoctor.models.calls import ranks_phrase

NAME = "unused_params"
_MARK = "Expected to have finished reduction in the prior iteration"
_NAMES = re.compile(r"Parameters which did not receive grad for rank (\d+): ([^\n]+)")
_INDICES = re.compile(r"Parameter indices which did not receive grad for rank (\d+): ([\d ]+)")


def check(record: RunRecord) -> list[Finding]:
    if not any(rank.evidence.backward for rank in record.ranks):
        return _from_ddp_error(record)
    missing_by_step: dict[int, dict[int, tuple[str, ...]]] = {}
    for rank in record.ranks:
        for backward in rank.evidence.backward:
            if backward.no_grad_params:
                missing_by_step.setdefault(backward.step, {})[rank.rank] = backward.no_grad_params
    for step in sorted(missing_by_step):
        problem = _sync_problem(record, step)
        if problem is None:
            continue
        missing = missing_by_step[step]
        names = sorted({name for held in missing.values() for name in held})
        by_names: dict[tuple[str, ...], list[int]] = {}
        for number, held in sorted(missing.items()):
            by_names.setdefault(held, []).append(number)
        listing = "; ".join(f"{', '.join(names)} on {ranks_phrase(ranks)}"
                            for names, ranks in by_names.items())
        return [finding(
            "unused-params", check=NAME,
            headline=f"{len(names)} params without grad, "
            f"{'all ranks' if len(missing) == len(record.ranks) else ranks_phrase(missing)}, "
            f"step {step}",
            symptom=f"at step {step}, before its gradient sync, parameters got no gradient: "
            f"{listing}; then {problem}",
            fix_changes={"knobs.find_unused_parameters": True}, ranks=sorted(missing),
            measured={"step": step, "no_grad_params": {str(r): list(n) for r, n in missing.items()},
             "sync_problem": problem}, kind="unused-params", first_step=step)]
    return []


def _sync_problem(record: RunRecord, step: int) -> str | None:
    """What went wrong with the gradient sync of ``step``, or None if it coped."""
    done = {r.rank: s for r in record.ranks for s in r.evidence.steps if s.step == step}
    unfinished = [r.rank for r in record.ranks if r.rank not in done]
    if unfinished:
        return f"{ranks_phrase(unfinished)} never finished step {step}"
    silent = [r for r, s in done.items() if s.allreduce_calls == 0]
    if silent:
        return (f"{ranks_phrase(silent)} issued no gradient all-reduce at all "
                f"(gradients silently not averaged)")
    if len({s.grad_synced.digest for s in done.values() if s.grad_synced}) > 1:
        return "the ranks applied different gradients"
    return None


def _from_ddp_error(record: RunRecord) -> list[Finding]:
    """The parameters torch DDP's reducer error names on each rank that raised it."""
    missing: dict[int, list[str]] = {}
    for rank in record.ranks:
        error = rank.end.error or ""
        if _MARK not in error:
            continue
        named = _NAMES.search(error)
        indexed = _INDICES.search(error)
        if named:
            missing[rank.rank] = sorted(n.strip() for n in named.group(2).split(","))
        elif indexed:
            params = rank.evidence.ddp_params
            missing[rank.rank] = [params[int(i)] if int(i) < len(params) else f"#{i}"
                                  for i in indexed.group(2).split()]
        else:
            missing[rank.rank] = []
    if not missing:
        return []
    listing = "; ".join(f"rank {r}: {', '.join(names) or 'unknown parameters'}"
                        for r, names in sorted(missing.items()))
    return [finding(
        "unused-params", check=NAME,
        headline=f"DDP: params without grad on {ranks_phrase(missing)}",
        symptom=f"DDP stopped with 'Expected to have finished reduction in the prior iteration': "
        f"parameters got no gradient in the previous step ({listing})",
        fix_changes={"knobs.find_unused_parameters": True}, ranks=sorted(missing),
        measured={"no_grad_params": {str(r): names for r, names in missing.items()}},
        fix="pass find_unused_parameters=True to DistributedDataParallel, or make every "
            "rank use every parameter in its loss", kind="unused-params")]

