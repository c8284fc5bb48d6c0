"""Why replicas' gradient synchronisation failed, from the reductions themselves.

Every rank of a replica group (analysis/replicas.py: the ranks its gradients are reduced
with) must apply the reduced gradient, and its k-th reduction on the group must reduce the
same tensor as every other member's k-th. Two ways to break that, which nothing raises:

* a reduction started asynchronously (``async_op=True``) whose Work the rank neither waited
  for nor handed to a future before the optimiser step that applies the gradient: gloo (or
  nccl) finishes it in the background, and the rank applies whatever the gradient held;
* members that reduce their gradients in different orders (a dict or set walked in a
  per-rank order, a condition on the rank): same-shaped tensors pair across ranks, and
  each gets the mean of different parameters.

Read from which storage each reduction reduced and when the rank waited for it, never from
the values: the parting this causes is ``divergent_parameters``'s, the cause is named here.
"""

from __future__ import annotations

from distdoctor.analysis.replicas import gradient_reductions, replicas_of
from distdoctor.models import Finding, RunRecord
from distdoctor.models.calls import ranks_phrase
from distdoctor.models.evidence import Call, GradientEvidence

NAME = "failed_sync"


def check(record: RunRecord) -> list[Finding]:
    if len(record.ranks) < 2:
        return []
    return _unwaited(record) or _paired_apart(record)


def _unwaited(record: RunRecord) -> list[Finding]:
    late: dict[int, list[tuple[Call, GradientEvidence]]] = {}
    for rank in record.ranks:
        for call, sample in gradient_reductions(rank.evidence):
            assert sample.t is not None
            if call.async_op and not call.future and \
                    (call.waited is None or call.waited > sample.t):
                late.setdefault(rank.rank, []).append((call, sample))
    if not late:
        return []
    ranks = sorted(late)
    call, sample = late[ranks[0]][0]
    count = len(late[ranks[0]])
    where = tuple(dict.fromkeys((call.where, sample.where)))
    return [Finding(
        check=NAME, fault="failed-sync",
        symptom=f"{ranks_phrase(ranks)} applied gradients whose reduction had not finished: "
                f"{count} {call.op}{'s' if count > 1 else ''} of gradients started with "
                f"async_op=True at {call.where} {'were' if count > 1 else 'was'} not waited "
                f"for before optimizer.step() at {sample.where} (first at step "
                f"{sample.step}); gloo completes them in the background, so each rank "
                f"applies whatever its gradient held at that moment",
        cause="an asynchronous gradient reduction whose Work is never waited before the "
              "optimiser step",
        fix=f"call work.wait() on every Work the reductions at {call.where} return (or "
            f"torch.futures.wait_all on their futures) before optimizer.step() at "
            f"{sample.where}",
        fix_changes={}, ranks=tuple(ranks),
        measured={"unwaited": {str(r): len(calls) for r, calls in late.items()},
                  "first_step": sample.step, "where": call.where},
        headline=f"{count} reductions not waited", kind="failed-sync",
        first_step=sample.step, where=where)]


def _paired_apart(record: RunRecord) -> list[Finding]:
    """The first reduction, on a replica group, at which members reduced different
    gradients (by their place in the optimiser's parameters, alike on every rank)."""
    reduced: dict[tuple, dict[int, tuple[frozenset[int], Call]]] = {}
    groups = {r.rank: replicas_of(r.evidence).group for r in record.ranks}
    for rank in record.ranks:
        for call, sample in gradient_reductions(rank.evidence):
            if call.group != groups[rank.rank]:
                continue
            which = frozenset(i for i, s in enumerate(sample.grad_storages)
                              if s in call.storages)
            reduced.setdefault((sample.step, call.group, call.pg, call.seq), {})[
                rank.rank] = (which, call)
    in_order = sorted(reduced.items(), key=lambda item: (item[0][0], item[0][3]))  # step, seq
    for (step, group, _, seq), by_rank in in_order:
        if len(by_rank) < 2 or len({which for which, _ in by_rank.values()}) == 1:
            continue
        first = min(by_rank)
        differ = [r for r, (which, _) in sorted(by_rank.items()) if which != by_rank[first][0]]
        lines = tuple(dict.fromkeys(call.where for _, call in by_rank.values()))
        said = "; ".join(f"rank {r} its parameter {_named(which)} at {call.where}"
                         for r, (which, call) in sorted(by_rank.items()))
        return [Finding(
            check=NAME, fault="failed-sync",
            symptom=f"the replicas' {by_rank[first][1].op} #{seq} on "
                    f"{ranks_phrase(list(group))} at step {step} reduced different "
                    f"gradients: {said} (parameters numbered in the optimiser's order); "
                    f"same-shaped tensors pair across ranks, so each rank gets the mean of "
                    f"different parameters and nothing errors",
            cause="the ranks reduce their gradients in orders of their own",
            fix="reduce the gradients in one fixed order on every rank (the optimiser's "
                "parameter order, not a dict or set walked per rank, nor a condition on "
                f"the rank) at {', '.join(lines)}, or reduce one flat buffer of them",
            fix_changes={}, ranks=tuple(differ),
            measured={"step": step, "seq": seq, "group": list(group),
                      "parameters": {str(r): sorted(w) for r, (w, _) in by_rank.items()}},
            headline=f"reduction #{seq} paired apart", kind="failed-sync", first_step=step,
            where=lines)]
    return []


def _named(which: frozenset[int]) -> str:
    return ", ".join(map(str, sorted(which))) if which else "(none sampled)"
