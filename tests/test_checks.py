"""Detectors on hand-made records: edge cases whose numbers can be worked out by hand."""

from __future__ import annotations

import pytest

from distdoctor.checks import (
    allreduce_every_microbatch,
    divergent_parameters,
    non_finite,
    rank_dependent_update,
    shared_shuffle_seed,
    sum_without_mean,
    unused_params,
)
from distdoctor.models import (
    BackwardEvidence,
    BatchEvidence,
    Call,
    Evidence,
    Fingerprint,
    GradientEvidence,
    NonFiniteEvidence,
    RankEnd,
    RankRecord,
    RunRecord,
    RunSpec,
    StepEvidence,
)

pytestmark = pytest.mark.tier("unit")


def fp(values, digest=None) -> Fingerprint:
    return Fingerprint(len(values), digest or repr(values), 0.0, tuple(values))


def step(n, ids=(), local=(1.0,), synced=(1.0,), calls=1, sent=4, grad_bytes=4, epoch=0):
    return StepEvidence(step=n, epoch=epoch, sample_ids=tuple(ids), loss=0.0, params=fp([0.0]),
                        grad_local=fp(local), grad_synced=fp(synced), allreduce_calls=calls,
                        allreduce_bytes=sent, gradient_bytes=grad_bytes)


def record(*per_rank_steps, backward=None, status="finished") -> RunRecord:
    ranks = []
    for rank, steps in enumerate(per_rank_steps):
        evidence = Evidence(rank, backward=tuple((backward or {}).get(rank, ())),
                            steps=tuple(steps))
        ranks.append(RankRecord(rank, RankEnd(rank, status), evidence))
    return RunRecord(RunSpec(world_size=len(ranks)), tuple(ranks), 0.1)


def test_overlap_share_is_shared_ids_over_all_ids_seen_in_the_epoch():
    found = shared_shuffle_seed.check(record([step(1, ids=[0, 1, 2, 3, 4, 5])],
                                        [step(1, ids=[4, 5, 6, 7, 8, 9])]))
    assert found[0].measured["overlap_share_per_epoch"] == {"0": 2 / 10}


def test_a_single_epoch_cannot_be_replayed_and_one_rank_cannot_overlap():
    assert shared_shuffle_seed.check(record([step(1, ids=[1, 2]), step(2, ids=[3, 4])])) == []


def test_gradient_scale_is_the_projection_on_the_mean_of_local_gradients():
    # local gradients (1, 3) and (3, 1): mean (2, 2); a synced (6, 6) is 3x the mean
    found = sum_without_mean.check(record([step(1, local=(1, 3), synced=(6, 6))],
                                        [step(1, local=(3, 1), synced=(6, 6))]))
    assert found[0].measured["ratio"] == 3.0


def test_gradient_scale_skips_steps_where_ranks_applied_different_gradients():
    assert sum_without_mean.check(record([step(1, local=(1, 3), synced=(1, 3))],
                                       [step(1, local=(3, 1), synced=(3, 1))])) == []


def test_several_buckets_moving_the_minimum_are_not_redundant():
    several = record([step(1, calls=3, sent=12, grad_bytes=12)])
    assert allreduce_every_microbatch.check(several) == []
    found = allreduce_every_microbatch.check(record([step(1, calls=2, sent=24, grad_bytes=12)]))
    assert found[0].measured["wasted_share"] == 0.5


def test_missing_gradients_the_sync_coped_with_are_not_reported():
    missing = {0: [BackwardEvidence(1, ("aux.weight",))], 1: [BackwardEvidence(1, ())]}
    coped = record([step(1)], [step(1)], backward=missing)
    assert unused_params.check(coped) == []
    diverged = record([step(1, synced=(1.0,))], [step(1, synced=(2.0,))], backward=missing)
    assert "different gradients" in unused_params.check(diverged)[0].symptom
    stuck = record([step(1)], [], backward=missing, status="raised")
    assert unused_params.check(stuck)[0].measured["sync_problem"] == "rank 1 never finished step 1"


def loader_record(per_rank: dict[int, list[tuple[int, list[int]]]], groups: dict[int, tuple],
                  trains: bool = True, sampler: str = "RandomSampler",
                  data: dict[int, str] | None = None, shuffles: bool | None = None) -> RunRecord:
    """A user's script's batches: ``per_rank[rank]`` = [(epoch, ids), ...] from loader 0;
    ``groups[rank]``: the ranks its DDP averages over (() for none); ``data[rank]``: the
    digest of the dataset it drew from ("" unknown); ``shuffles``: whether the sampler
    reshuffles each pass (None unknown)."""
    ranks = []
    for rank, drawn in per_rank.items():
        batches = tuple(BatchEvidence(0, epoch, tuple(ids), sampler, None, "train.py:9", trains,
                                      (data or {}).get(rank, ""), shuffles)
                        for epoch, ids in drawn)
        evidence = Evidence(rank, batches=batches, ddp_group=groups.get(rank, ()))
        ranks.append(RankRecord(rank, RankEnd(rank, "finished"), evidence))
    return RunRecord(RunSpec(world_size=len(ranks)), tuple(ranks), 0.1)


SAME = [(0, [0, 1, 2, 3]), (1, [2, 0, 3, 1])]  # one shuffled pass per epoch, reshuffled


def test_replicas_of_one_ddp_reading_the_same_samples_overlap_fully():
    found = shared_shuffle_seed.check(loader_record({0: SAME, 1: SAME}, {0: (0, 1), 1: (0, 1)}))
    assert [f.measured["max_overlap_share"] for f in found] == [1.0]
    assert found[0].measured["where"] == "train.py:9" and "DistributedSampler" in found[0].fix


def test_ranks_drawing_from_datasets_of_their_own_read_different_samples_under_one_id():
    """Each rank's own shard of the files: ids 0..3 on both ranks, from datasets whose
    digests differ; the same digest, or none recorded (an older trace), is one dataset."""
    ddp = {0: (0, 1), 1: (0, 1)}
    own = loader_record({0: SAME, 1: SAME}, ddp, data={0: "a1", 1: "b2"})
    assert shared_shuffle_seed.check(own) == []
    for data in ({0: "a1", 1: "a1"}, {0: "a1"}):
        assert shared_shuffle_seed.check(loader_record({0: SAME, 1: SAME}, ddp, data=data))


def test_the_padding_that_evens_out_the_shares_is_not_a_sample_read_twice():
    """32 samples on 3 ranks: DistributedSampler deals 11 each, one sample twice (33 draws
    of 32); a share read twice is more repeats than ranks, or shares of other sizes."""
    groups = {r: (0, 1, 2) for r in range(3)}
    padded = {0: [(0, list(range(0, 11)))], 1: [(0, list(range(11, 22)))],
              2: [(0, [*range(22, 32), 0])]}
    assert shared_shuffle_seed.check(loader_record(padded, groups,
                                                   sampler="DistributedSampler")) == []
    twice = {**padded, 2: [(0, [*range(20, 30), 0])]}  # 10 + 11 + 11 repeats of 30 samples
    assert shared_shuffle_seed.check(loader_record(twice, groups))
    uneven = {**padded, 2: [(0, [*range(22, 32), 0, 1])]}
    assert shared_shuffle_seed.check(loader_record(uneven, groups))


def test_ranks_in_different_ddp_groups_may_read_the_same_samples():
    """Tensor or pipeline parallel peers (0 with 2, 1 with 3) read the same batches by
    design; each DDP group's replicas (0, 1) and (2, 3) read disjoint ones."""
    a, b = [(0, [0, 1]), (1, [3, 0])], [(0, [2, 3]), (1, [1, 2])]
    groups = {0: (0, 1), 1: (0, 1), 2: (2, 3), 3: (2, 3)}
    assert shared_shuffle_seed.check(loader_record({0: a, 1: b, 2: a, 3: b}, groups)) == []
    assert shared_shuffle_seed.check(loader_record({0: a, 1: a, 2: b, 3: b}, groups))


def test_evaluation_loaders_and_ranks_without_ddp_are_not_called_duplicates():
    shared = {0: SAME, 1: SAME}
    evaluating = loader_record(shared, {0: (0, 1), 1: (0, 1)}, trains=False)
    assert shared_shuffle_seed.check(evaluating) == []
    assert shared_shuffle_seed.check(loader_record(shared, {})) == []  # independent models


def test_a_pass_that_repeats_the_last_one_is_replayed_on_every_rank():
    replay = [(0, [3, 1]), (0, [0, 2]), (1, [3, 1]), (1, [0, 2])]
    found = shared_shuffle_seed.check(loader_record({0: replay, 1: [(e, [i + 4 for i in ids])
                                                              for e, ids in replay]}, {}))
    assert [f.measured["replayed_epochs"] for f in found] == [[1]]
    assert "before the loop over the DataLoader at train.py:9" in found[0].fix
    # a sampler that keeps one order on purpose (DistributedSampler(shuffle=False),
    # SequentialSampler) replays it by design; one that shuffles does not
    for shuffles, replays in ((False, 0), (True, 1), (None, 1)):
        kept = loader_record({0: replay, 1: [(e, [i + 4 for i in ids]) for e, ids in replay]},
                             {}, sampler="DistributedSampler", shuffles=shuffles)
        assert len(shared_shuffle_seed.check(kept)) == replays, shuffles


def test_a_pass_trains_when_an_optimiser_stepped_during_it():
    from distdoctor.trace.folds import fold_batches

    def batch(epoch, steps, loader=0):
        return {"ev": "batch", "loader": loader, "epoch": epoch, "ids": [epoch], "steps": steps,
                "sampler": "RandomSampler", "where": "t.py:1"}
    events = [batch(0, 0), batch(0, 1), {"ev": "pass_end", "loader": 0, "epoch": 0, "steps": 2},
              batch(0, 2, loader=1), {"ev": "pass_end", "loader": 1, "epoch": 0, "steps": 2},
              batch(1, 2), {"ev": "pass_end", "loader": 0, "epoch": 1, "steps": 3}]
    assert [(b.loader, b.epoch, b.trains) for b in fold_batches(events)] == [
        (0, 0, True), (0, 0, True), (1, 0, False), (0, 1, True)]


def grads_record(*per_rank: list[tuple[tuple, tuple]]) -> RunRecord:
    """``per_rank[rank]`` = [(local, applied), ...] sampled gradients per optimiser step."""
    ranks = []
    for rank, steps in enumerate(per_rank):
        gradients = tuple(GradientEvidence(n, fp(list(local)), fp(list(applied)))
                          for n, (local, applied) in enumerate(steps, 1))
        ranks.append(RankRecord(rank, RankEnd(rank, "finished"),
                                Evidence(rank, gradients=gradients)))
    return RunRecord(RunSpec(world_size=len(ranks)), tuple(ranks), 0.1)


def test_a_users_summed_gradients_are_twice_the_mean_at_two_ranks():
    # local (1, 3) and (3, 1): mean (2, 2); both ranks applied the sum (4, 4)
    found = sum_without_mean.check(grads_record([((1, 3), (4, 4))], [((3, 1), (4, 4))]))
    assert found[0].measured["ratio"] == 2.0
    assert sum_without_mean.check(grads_record([((1, 3), (2, 2))], [((3, 1), (2, 2))])) == []


def test_ranks_that_never_synchronise_are_not_judged():
    """Independent models (nothing reduced) and ranks that applied different gradients."""
    same = [((1, 1), (1, 1))]
    assert sum_without_mean.check(grads_record(same, same)) == []
    assert sum_without_mean.check(grads_record([((1, 3), (4, 4))], [((3, 1), (5, 5))])) == []


def nan_step(n, loss=None, local=()):
    return NonFiniteEvidence(n, loss, "train.py:9", tuple(local), "train.py:10")


def user_record(*per_rank):
    ranks = tuple(RankRecord(rank, RankEnd(rank, "finished"), Evidence(rank, nonfinite=tuple(e)))
                  for rank, e in enumerate(per_rank))
    return RunRecord(RunSpec(world_size=len(ranks)), ranks, 0.1)


def test_a_nan_is_traced_to_the_rank_whose_own_loss_went_first():
    # rank 2 went Inf at step 4 by itself; the all-reduce took it to rank 1 at step 5 and
    # to rank 0 at step 6; rank 3 never showed it
    found = non_finite.check(user_record(
        [nan_step(6, loss=float("nan"))], [nan_step(5, local=["w"]), nan_step(6, local=["w"])],
        [nan_step(4, loss=float("inf"), local=["w", "b"])], []))
    assert [f.ranks for f in found] == [(2,)]
    assert {k: found[0].measured[k] for k in ("first_step", "origin_ranks", "loss_ranks",
                                             "gradient_ranks", "reached", "params",
                                             "where")} == {
        "first_step": 4, "origin_ranks": [2], "loss_ranks": [2], "gradient_ranks": [2],
        "reached": {"0": 6, "1": 5}, "params": ["b", "w"], "where": "train.py:9"}
    assert "it reached rank 0 at step 6, rank 1 at step 5" in found[0].symptom


def test_a_gradient_gone_non_finite_under_a_finite_loss_is_named_at_the_step_line():
    found = non_finite.check(user_record([], [nan_step(2, loss=0.5, local=["w"])]))
    assert found[0].ranks == (1,) and found[0].measured["where"] == "train.py:10"
    assert found[0].measured["loss_ranks"] == [] and found[0].measured["reached"] == {}


def test_the_built_in_workload_is_judged_on_its_own_losses_and_gradient_norms():
    def at(n, loss=0.0, local=0.0, synced=0.0):
        return StepEvidence(step=n, epoch=0, sample_ids=(), loss=loss, params=fp([0.0]),
                            grad_local=Fingerprint(1, "l", local, (local,)),
                            grad_synced=Fingerprint(1, "s", synced, (synced,)),
                            allreduce_calls=1, allreduce_bytes=4, gradient_bytes=4)
    nan = float("nan")
    assert non_finite.check(record([at(1), at(2)], [at(1), at(2)])) == []
    found = non_finite.check(record([at(1), at(2, synced=nan)], [at(1), at(2, loss=nan, local=nan,
                                                                           synced=nan)]))
    assert found[0].measured == {"first_step": 2, "origin_ranks": [1], "received_ranks": [0],
                                 "losses": {"0": 0.0, "1": found[0].measured["losses"]["1"]}}


def params_record(*per_rank, reduced: int | None = 2):
    """``per_rank[rank]`` = [(local, applied, params) or (None, None, params), ...] per
    optimiser step: None where the step's gradients were not sampled, only its
    parameters. ``reduced``: before each step every rank all-reduces that many elements
    over every rank (storage 99: none of theirs, so no replica group is read from it,
    only that the ranks reduced together): 2, a flat copy of the 2 gradients; 1, a loss
    reduced for logging; None, nothing."""
    ranks = []
    group = tuple(range(len(per_rank)))
    for rank, steps in enumerate(per_rank):
        gradients = tuple(GradientEvidence(n, None if a is None else fp(list(local)),
                                           None if a is None else fp(list(a)), fp(list(p)),
                                           "train.py:7")
                          for n, (local, a, p) in enumerate(steps, 1))
        calls = tuple(Call(n, rank, "all_reduce", n, group, None, (), ((reduced,),),
                           "float32", "sum", "train.py:6", False, float(n),
                           completed=float(n), storages=(99,), step=n - 1)
                      for n in range(1, len(steps) + 1)) if reduced else ()
        ranks.append(RankRecord(rank, RankEnd(rank, "finished"),
                                Evidence(rank, gradients=gradients, calls=calls)))
    return RunRecord(RunSpec(world_size=len(ranks)), tuple(ranks), 0.1)


def test_replicas_parting_between_sampled_steps_are_caught_at_the_step_they_part():
    # each rank's own gradient, and the mean of both applied: one synchronisation
    mine = [((1, 3), (2, 2), (5,)), ((1, 3), (2, 2), (4,)), (None, None, (3,))]
    theirs = [((3, 1), (2, 2), (5,)), ((3, 1), (2, 2), (4,))]
    found = divergent_parameters.check(params_record(mine, theirs + [(None, None, (3.5,))]))
    assert found[0].measured["first_divergent_step"] == 3
    assert found[0].measured["ranks_differing_from_rank_0"] == [1]
    # ranks that apply their own gradients, never a multiple of the mean, are no replicas
    own = [((3, 1), (3, 1), (5,)), ((3, 1), (3, 1), (4,)), (None, None, (7,))]
    assert divergent_parameters.check(params_record(mine, own)) == []
    # nor is a gradient step on one rank compared with a parameters-only one on another
    mixed = params_record(mine, theirs + [((3, 1), (2, 2), (3.5,))])
    assert divergent_parameters.check(mixed) == []


def test_ranks_whose_gradients_agree_without_a_reduction_are_no_replicas():
    """A learning-rate sweep on one dataset (examples/healthy/lr_sweep_same_data.py): one
    seed, the same batch, so the first step's gradients agree on both ranks, and each
    applies its own; its own learning rate parts the parameters. Only a reduction of the
    gradients' size the ranks made together says they are replicas."""
    same = [((1, 3), (1, 3), (5,)), ((2, 2), (2, 2), (4,))]
    own_rate = [((1, 3), (1, 3), (5,)), ((2, 2), (2, 2), (3,))]
    for logged in (None, 1):  # nothing reduced, or only a loss for the log
        apart = params_record(same, own_rate, reduced=logged)
        assert divergent_parameters.check(apart) == []
        assert rank_dependent_update.check(apart) == []
    found = divergent_parameters.check(params_record(same, own_rate))
    assert found[0].measured["first_divergent_step"] == 2
    assert found[0].measured["ranks_differing_from_rank_0"] == [1]


def test_a_dumps_open_calls_that_part_evenly_defer_to_the_histories_that_show_the_culprit():
    """A real job's Flight Recorder dumps (eval_on_rank0_through_ddp.py, 1 run in 10):
    rank 0's extra DDP forward at line 21 paired with rank 1's training forward, and the
    dumps' open operations part at #18 with no side standing out, while the histories show
    the extra broadcast. Once the open calls' lines alone (not every line each rank ran)
    made rank 1's backward "a line no other rank ran" and blamed rank 1."""
    import json
    from pathlib import Path

    from distdoctor.analysis.sequences import first_parting, lines_run, parting_of
    from distdoctor.checks import collective_mismatch
    from distdoctor.models import RunRecord
    from distdoctor.models.jsoncodec import from_json

    saved = Path(__file__).parent / "records" / "ddp_forward_on_rank0_dumps.json"
    record = from_json(RunRecord, json.loads(saved.read_text()))
    lines = {r.rank: lines_run(r) for r in record.ranks}
    traced = first_parting({r.rank: r.evidence.calls for r in record.ranks}, 2, lines)
    assert traced is not None and traced.blame == "even"  # the open calls alone
    assert parting_of(record.ranks).culprits == (0,)
    found = collective_mismatch.check(record)
    assert [f.ranks for f in found] == [(0,)]
    assert "eval_on_rank0_through_ddp.py:21" in found[0].where[0]


def test_micro_batches_all_inside_no_sync_and_reduced_by_hand_are_synchronised():
    """Accumulation with every micro-batch inside no_sync(), then the gradients (16 float32
    values: 64 bytes, as DDP's sync would move) all-reduced by hand before the step: one
    gradient on every replica. The same without the all-reduce, with half of it, or with
    it before the last micro-batch, leaves the sum each rank's own."""
    from distdoctor.checks import unsynced_microbatches
    from distdoctor.models import DDPForward

    def ranks_record(reduce_at: float | None, elements: int = 16) -> RunRecord:
        ranks = []
        for rank in (0, 1):
            forwards = tuple(DDPForward(0, False, 64, "train.py:9", t) for t in (1.0, 2.0))
            calls = () if reduce_at is None else (Call(
                1, rank, "all_reduce", 0, (0, 1), None, (), ((elements,),), "float32", "sum",
                "train.py:12", False, reduce_at, completed=reduce_at + 0.1, step=0),)
            evidence = Evidence(rank, ddp_forwards=forwards, ddp_group=(0, 1), calls=calls,
                                gradients=(GradientEvidence(1, fp([1.0]), fp([1.0])),))
            ranks.append(RankRecord(rank, RankEnd(rank, "finished"), evidence))
        return RunRecord(RunSpec(world_size=2), tuple(ranks), 0.1)

    assert unsynced_microbatches.check(ranks_record(3.0)) == []
    for unsynced in (ranks_record(None), ranks_record(3.0, elements=8), ranks_record(1.5)):
        assert unsynced_microbatches.check(unsynced)[0].measured["steps"] == {"0": [1],
                                                                              "1": [1]}
