"""Did the ranks split each epoch between them, and does each epoch reshuffle?

A distributed sampler deals every epoch out in disjoint shares: no sample id may appear
on two ranks in one epoch (share 0%), and, when it shuffles, epoch e must not replay epoch
e-1's order (a sampler that keeps one order on purpose, ``shuffle=False``, replays it). The
one exception is the padding that evens the shares out (torch's DistributedSampler
without drop_last repeats a few samples so that every rank gets as many): fewer extra
draws than there are ranks, each rank drawing as many, is that padding, not a share read
twice. The
same rule reads the built-in workload's steps and the batches a user's script drew from
its data loaders (recorded by the tracer's batch-sampler hook).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from distdoctor.checks import finding
from distdoctor.models import Finding, RunRecord
from distdoctor.models.calls import ranks_phrase

NAME = "shared_shuffle_seed"


def check(record: RunRecord) -> list[Finding]:
    found = []
    for batches, loop, peers in _passes(record):
        if peers:
            found += _overlap(batches, loop)
        if loop is None or loop.shuffles is not False:  # an order kept on purpose is kept
            found += _replayed_epochs(batches, loop)
    return found


def _passes(record: RunRecord) -> list[tuple[dict, Loop | None, bool]]:
    """Per data loader, epoch -> rank -> [batch, ...] in the order drawn, and whether those
    ranks are data-parallel peers (so must draw disjoint samples). The built-in workload's
    steps say their epoch, and its ranks holding the same part of the model (all of it, or
    the same tensor-parallel slice) are replicas: the ranks of a tensor-parallel group
    hold different slices and read the same batch by design; the replicas of the first
    slice speak for all (every slice's replicas read alike). A user's script's batches come from
    the tracer, one loader at a time and only loaders an optimiser stepped during
    (evaluation loaders read the same samples on every rank by design), grouped by the DDP
    group each rank averages over: pipeline stages or tensor-parallel shards read the same
    batches by design, and only ranks that share a DDP are known to be replicas. Ids
    index a dataset: ranks whose loaders draw from datasets of their own (digests that
    differ: each rank's own shard of the files) read different samples under the same
    ids, and are not compared."""
    # what a rank holds -> epoch -> rank -> its batches
    steps: defaultdict = defaultdict(lambda: defaultdict(dict))
    for rank in record.ranks:
        for step in rank.evidence.steps:
            steps[rank.evidence.holds][step.epoch].setdefault(rank.rank, []).append(
                step.sample_ids)
    found = [(steps[min(steps)], None, True)] if steps else []
    loaders: defaultdict = defaultdict(lambda: defaultdict(dict))  # (loader, group) -> epoch
    loops: dict[int, Loop] = {}
    # (loader, group) -> epoch -> the dataset digests its ranks drew from in that pass
    datasets: defaultdict = defaultdict(lambda: defaultdict(set))
    for rank in record.ranks:
        group = rank.evidence.ddp_group
        for batch in rank.evidence.batches:
            if batch.trains:
                loaders[batch.loader, group][batch.epoch].setdefault(rank.rank, []).append(
                    batch.sample_ids)
                loops.setdefault(batch.loader, Loop(batch.where, batch.sampler, batch.shuffles))
                if batch.data:  # (a trace without the digest: judged as one dataset)
                    datasets[batch.loader, group][batch.epoch].add(batch.data)
    return found + [(loaders[key], loops[key[0]], len(key[1]) > 1 and all(
        len(digests) < 2 for digests in datasets[key].values())) for key in sorted(loaders)]


@dataclass(frozen=True)
class Loop:
    """Where a user's script iterates a loader, and the sampler class it draws from."""

    where: str
    sampler: str
    shuffles: bool | None = None  # its sampler reshuffles each pass (None: not known)


def _overlap(batches: dict, loop: Loop | None = None) -> list[Finding]:
    shares: dict[int, float] = {}
    ranks_involved: set[int] = set()
    for epoch, per_rank in sorted(batches.items()):
        seen = defaultdict(set)
        for rank, rank_batches in per_rank.items():
            for sample in (i for batch in rank_batches for i in batch):
                seen[sample].add(rank)
        shared = [s for s, ranks in seen.items() if len(ranks) > 1]
        if _padded(per_rank, len(seen)):
            shared = []
        shares[epoch] = len(shared) / len(seen) if seen else 0.0
        ranks_involved.update(r for s in shared for r in seen[s])
    worst = max(shares.values(), default=0.0)
    if worst == 0.0:
        return []
    per_epoch = ", ".join(f"epoch {e}: {share:.0%}" for e, share in shares.items())
    at = f" from the loader iterated at {loop.where} ({loop.sampler})" if loop else ""
    measured = {"overlap_share_per_epoch": {str(e): s for e, s in shares.items()},
                "max_overlap_share": worst}
    fix = None
    if loop:
        measured.update(where=loop.where, sampler=loop.sampler)
        fix = (f"give the DataLoader iterated at {loop.where} a DistributedSampler(dataset), "
               f"which deals each epoch out across the ranks, instead of its {loop.sampler} "
               f"(or seed each rank's shuffle with seed + rank and split the data)")
    return [finding(
        "shared-shuffle-seed", check=NAME, headline=f"{worst:.0%} of an epoch on several ranks",
        symptom=f"{worst:.0%} of the samples in an epoch were trained on by more than one rank "
        f"({per_epoch}; 0% when the epoch is dealt out); {ranks_phrase(ranks_involved)} "
        f"drew the same samples{at}",
        fix_changes={"knobs.sampler": "distributed"}, ranks=ranks_involved, measured=measured,
        fix=fix,
        kind="duplicate-samples", where=loop.where if loop else ())]


def _padded(per_rank: dict, unique: int) -> bool:
    """Are an epoch's repeats only the padding that gives every rank as many samples?"""
    drawn = [sum(map(len, rank_batches)) for rank_batches in per_rank.values()]
    return len(set(drawn)) == 1 and sum(drawn) - unique < len(drawn)


def _replayed_epochs(batches: dict, loop: Loop | None = None) -> list[Finding]:
    replayed, compared = [], {}
    epochs = sorted(batches)
    ranks = sorted({rank for per_rank in batches.values() for rank in per_rank})
    for previous, epoch in zip(epochs, epochs[1:]):
        same_on = []
        for rank in ranks:
            now, before = batches[epoch].get(rank, []), batches[previous].get(rank, [])
            steps = min(len(now), len(before))
            if steps and now[:steps] == before[:steps]:
                same_on.append(rank)
                compared[epoch] = steps
        if same_on and len(same_on) == len(batches[epoch]):
            replayed.append(epoch)
    if not replayed:
        return []
    listing = ", ".join(f"epoch {e} ({compared[e]} steps compared)" for e in replayed)
    measured = {"replayed_epochs": replayed,
                "steps_compared": {str(e): n for e, n in compared.items()}}
    fix = "call sampler.set_epoch(epoch) at the start of every epoch"
    if loop:
        measured.update(where=loop.where, sampler=loop.sampler)
        fix = (f"call sampler.set_epoch(epoch) at the start of every epoch, before the loop "
               f"over the DataLoader at {loop.where}")
    return [finding(
        "shared-shuffle-seed", check=NAME,
        headline=f"epoch{'s' * (len(replayed) > 1)} {', '.join(map(str, replayed))} replayed",
        symptom=f"every rank replayed the previous epoch's batches in the same order: {listing}; "
        f"a sampler reshuffles each epoch",
        fix_changes={"knobs.sampler_set_epoch": True}, ranks=ranks, measured=measured,
        cause="the sampler is never told the epoch (sampler.set_epoch is not called), so it "
              "shuffles with the same seed every epoch",
        fix=fix, kind="repeated-epoch-order", where=loop.where if loop else ())]
