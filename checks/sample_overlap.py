"""Did the ranks split each epoch between them, and does each epoch reshuffle?

A distributed sampler deals every epoch out in disjoint shares: no sample id may appear
on two ranks in one epoch (share 0%), and epoch e must not replay epoch e-1's order.
"""

from __future__ import annotations

from collections import defaultdict

from checks import finding, rank_list
from harness.models import Finding, RunRecord

NAME = "sample_overlap"


def check(record: RunRecord) -> list[Finding]:
    batches = defaultdict(dict)  # epoch -> rank -> [batch, ...] in step order
    for rank in record.ranks:
        for step in rank.evidence.steps:
            batches[step.epoch].setdefault(rank.rank, []).append(step.sample_ids)
    return _overlap(batches) + _replayed_epochs(batches, len(record.ranks))


def _overlap(batches: dict) -> list[Finding]:
    shares, ranks_involved = {}, set()
    for epoch, per_rank in sorted(batches.items()):
        seen = defaultdict(set)
        for rank, rank_batches in per_rank.items():
            for sample in (i for batch in rank_batches for i in batch):
                seen[sample].add(rank)
        shared = [s for s, ranks in seen.items() if len(ranks) > 1]
        shares[epoch] = len(shared) / len(seen) if seen else 0.0
        ranks_involved.update(r for s in shared for r in seen[s])
    worst = max(shares.values(), default=0.0)
    if worst == 0.0:
        return []
    per_epoch = ", ".join(f"epoch {e}: {share:.0%}" for e, share in shares.items())
    return [finding(
        "shared-shuffle-seed", NAME, f"{worst:.0%} of an epoch on several ranks",
        f"{worst:.0%} of the samples in an epoch were trained on by more than one rank "
        f"({per_epoch}; 0% when the epoch is dealt out); {rank_list(ranks_involved)} "
        f"drew the same samples",
        {"knobs.sampler": "distributed"}, ranks_involved,
        {"overlap_share_per_epoch": {str(e): s for e, s in shares.items()},
         "max_overlap_share": worst})]


def _replayed_epochs(batches: dict, world_size: int) -> list[Finding]:
    replayed, compared = [], {}
    epochs = sorted(batches)
    for previous, epoch in zip(epochs, epochs[1:]):
        same_on = []
        for rank in range(world_size):
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
    return [finding(
        "shared-shuffle-seed", NAME,
        f"epoch{'s' * (len(replayed) > 1)} {', '.join(map(str, replayed))} replayed",
        f"every rank replayed the previous epoch's batches in the same order: {listing}; "
        f"a sampler reshuffles each epoch",
        {"knobs.sampler_set_epoch": True}, range(world_size),
        {"replayed_epochs": replayed, "steps_compared": {str(e): n for e, n in compared.items()}},
        cause="the sampler is never told the epoch (sampler.set_epoch is not called), so it "
              "shuffles with the same seed every epoch",
        fix="call sampler.set_epoch(epoch) at the start of every epoch")]
