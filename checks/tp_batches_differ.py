"""Are the ranks of a tensor-parallel group handed one batch?

The ranks of a tensor-parallel group hold one model between them, so they must compute on
one batch: a column-parallel layer handed its input replicated (a DTensor Replicate: its
gradient is all-reduced over the group) takes it whole on every rank. When the first such
input of a forward already differs from rank to rank, before anything the group computes,
the ranks were handed different batches: data dealt out by global rank (a
DistributedSampler told every rank of the world) where it must be dealt by data-parallel
rank. Nothing fails; the group trains one model on the mix of its ranks' batches.
"""

from __future__ import annotations

from distdoctor.checks import first_input_parted, group_disagreements, lines
from distdoctor.models import Finding, RunRecord
from distdoctor.models.calls import ranks_phrase

NAME = "tp_batches_differ"


def check(record: RunRecord) -> list[Finding]:
    parted = first_input_parted(record)
    if parted is None or parted[1] is not None:
        return []  # none, explained upstream, or drawn apart inside the forward (dropout)
    first = parted[0]
    group = tuple(first["group"])
    parted_too = [d for d in group_disagreements(record, "input")
                  if d["step"] == first["step"] and d["name"] == first["name"]]
    groups = sorted({tuple(d["group"]) for d in parted_too})  # every group the layer parts in
    ranks = sorted({r for d in parted_too for r in d["ranks"]})
    dealt = _first_batches(record, group)
    measured = {"layer": first["name"], "first_step": first["step"], "spread": first["spread"],
                "groups": [list(g) for g in groups], "ranks": ranks, "where": first["where"],
                "first_batches": {str(r): list(ids) for r, (ids, _, _) in dealt.items()}}
    loader = ""
    if len({ids for ids, _, _ in dealt.values()}) > 1:
        shown = "; ".join(f"rank {r}: {_ids(ids)}" for r, (ids, _, _) in sorted(dealt.items()))
        sampler = next(iter(dealt.values()))[1]
        loader = (f"; their loader ({sampler}) deals them different samples, the first "
                  f"batch's: {shown}")
    return [Finding(
        check=NAME, fault="tp-batches-differ", kind="tp-batches-differ",
        headline=f"tensor-parallel group {group} is handed different batches"
        + (f" (and {len(groups) - 1} other group{'s' if len(groups) > 2 else ''})"
           if len(groups) > 1 else ""),
        symptom=f"at step {first['step']}, layer {first['name']}, the first column-parallel "
        f"layer of the forward, is handed its input whole on every rank of tensor-parallel "
        f"group {group}, but not the same input: largest difference {first['spread']:.3g}; "
        f"{ranks_phrase(first['ranks'])} {'differs' if len(first['ranks']) == 1 else 'differ'} "
        f"from rank {group[0]}, before any layer of the group has computed{loader}"
        + (f"; the same in group{'s' if len(groups) > 2 else ''} "
           f"{', '.join(map(str, groups[1:]))}" if len(groups) > 1 else ""),
        cause="the data is dealt out by global rank (a DistributedSampler, or a split of "
              "the dataset, told every rank of the world), so each rank of a "
              "tensor-parallel group reads its own batch where the group must read one",
        fix="deal the data by data-parallel rank: DistributedSampler(dataset, "
            "num_replicas=mesh['dp'].size(), rank=mesh['dp'].get_local_rank()), so every "
            "rank of a tensor-parallel group reads the same batch",
        fix_changes={}, ranks=tuple(ranks), measured=measured,
        first_step=first["step"], where=lines((_loop_line(dealt), first["where"])))]


def _loop_line(dealt: dict[int, tuple[tuple[int, ...], str, str]]) -> str:
    """The line of the loop that read the first batch ("" when no batch was recorded)."""
    return next(iter(dealt.values()))[2] if dealt else ""


def _first_batches(record: RunRecord,
                   group: tuple[int, ...]) -> dict[int, tuple[tuple[int, ...], str, str]]:
    """Each rank of ``group``'s first training batch from its first loader: (sample ids,
    sampler, the loop's line); empty unless every rank of the group recorded one."""
    dealt = {}
    for rank in record.ranks:
        batch = next((b for b in rank.evidence.batches if b.trains and b.epoch == 0), None)
        if rank.rank in group and batch is not None:
            dealt[rank.rank] = (batch.sample_ids, batch.sampler, batch.where)
    return dealt if len(dealt) == len(group) else {}


def _ids(ids: tuple[int, ...]) -> str:
    return ", ".join(map(str, ids[:4])) + (", ..." if len(ids) > 4 else "")
