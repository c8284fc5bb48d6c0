"""A user's ranks measure their training state against ``--memory-budget``: the bytes a
rank holds, counted from the model's shapes by hand (4 bytes a float32 element; Adam keeps
two moments and a 4-byte step counter per tensor), for DDP, ZeroRedundancyOptimizer and
FSDP2 on real ranks; the cheapest change that fits, worked out by hand; damaged evidence
read as missing, never a crash; nothing measured without a budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distdoctor.checks import over_memory_budget
from distdoctor.cli.args import size_in_bytes
from distdoctor.models import Evidence, MemoryEvidence, RankEnd, RankRecord, RunRecord, RunSpec
from distdoctor.teaching.course import exercise
from distdoctor.trace.folds import fold_memory

pytestmark = pytest.mark.tier("unit")

LAUNCHED = Path(__file__).parent / "launched"
# four Linear(64, 64): a 64x64 weight and 64 biases each
ELEMENTS = 4 * (64 * 64 + 64)
TENSORS = 8
WHOLE = 4 * ELEMENTS  # bytes of one float32 copy of the model: 66560
ADAM = 2 * WHOLE + 4 * TENSORS  # two moments and a step counter per tensor


@pytest.mark.parametrize("text, value", [("240000", 240_000), ("240KB", 240_000),
                                         ("80GB", 80 * 10 ** 9), ("512MiB", 512 * 2 ** 20),
                                         ("1.5kib", 1536), ("6 MB", 6 * 10 ** 6)])
def test_a_budget_is_read_in_bytes_or_with_a_unit(text, value):
    assert size_in_bytes(text) == value


def held(stage: int, world: int, params: int, grads: int, optimizer: int,
         budget: int) -> MemoryEvidence:
    return MemoryEvidence(step=1, stage=stage, world_size=world, params=params, grads=grads,
                          optimizer=optimizer, gathered=0, budget=budget,
                          model_params=ELEMENTS, largest_layer=64 * 64, layers=TENSORS,
                          optimizer_tensors=TENSORS)


def test_ddp_over_its_budget_is_told_to_partition_its_optimiser_state():
    """DDP holds 266272 bytes; ZeroRedundancyOptimizer on 2 ranks keeps half the Adam
    state, or at worst half plus the largest tensor's (a partition of whole tensors):
    133120 + 66576 + 32776 (4096 of 16640 elements' share) = 232472, within 240000."""
    fix, planned = over_memory_budget.torch_fix(held(0, 2, WHOLE, WHOLE, ADAM, 240_000))
    bound = 2 * WHOLE + ADAM / 2 + ADAM * 4096 / ELEMENTS
    assert planned == {"stage": 1, "world_size": 2, "bytes_per_rank": round(bound)}
    assert fix.startswith("wrap the optimiser in torch.distributed.optim."
                          "ZeroRedundancyOptimizer") and f"about {bound:.0f} bytes" in fix


def test_sharded_and_still_over_it_is_told_the_fewest_ranks_that_fit():
    """FSDP2 on 2 ranks holds half of everything, 133136 bytes; the whole is 266272, so
    100000 bytes a rank needs 3 ranks (88757)."""
    mine = held(3, 2, WHOLE // 2, WHOLE // 2, ADAM // 2, 100_000)
    fix, planned = over_memory_budget.torch_fix(mine)
    assert planned == {"stage": 3, "world_size": 3,
                       "bytes_per_rank": round((2 * WHOLE + ADAM) / 3)}
    assert fix.startswith("shard the model with fully_shard (FSDP2, ZeRO-3) on 3 ranks")
    # nothing fits 10 bytes a rank on any number of ranks the fix will propose
    fix, planned = over_memory_budget.torch_fix(held(3, 2, WHOLE, WHOLE, ADAM, 10))
    assert planned == {} and fix.startswith("no ZeRO stage on up to")


def test_a_partitioned_state_is_planned_from_every_ranks_partition():
    """ZeroRedundancyOptimizer on 3 ranks partitions whole tensors unevenly: rank 0 holds
    two of the four weights' moments (65544 bytes, as measured), the others less. The
    whole state is their sum (133152), not rank 0's times 3 (196632): fully_shard on the
    same 3 ranks fits 100 KB, where rank 0's alone would have asked for a fourth rank."""
    parts = [65544, 33804, 33804]  # the three partitions: 133152 in all
    ranks = tuple(RankRecord(r, RankEnd(r, "finished"), Evidence(r, memory=(
        held(1, 3, WHOLE, WHOLE, part, 100_000),))) for r, part in enumerate(parts))
    [found] = over_memory_budget.check(RunRecord(RunSpec(strategy="user-script",
                                                         world_size=3), ranks, 1.0))
    assert found.kind == "over-memory-budget" and found.ranks == (0, 1, 2)
    assert found.measured["planned"] == {"stage": 3, "world_size": 3,
                                         "bytes_per_rank": round((2 * WHOLE + ADAM) / 3)}
    assert found.fix_changes == {}  # a user's script: the fix is in words, not knobs


@pytest.mark.parametrize("source, edited", [
    ("import torch\nopt = torch.optim.Adam(m.parameters(), lr=1e-3)\n",
     "import torch\nfrom torch.distributed.optim import ZeroRedundancyOptimizer\n"
     "opt = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.Adam, "
     "lr=1e-3)\n"),
    ("from torch.optim import AdamW as W\nopt = W(m.parameters(), lr=1)\n",
     "from torch.optim import AdamW as W\nfrom torch.distributed.optim import "
     "ZeroRedundancyOptimizer\nopt = ZeroRedundancyOptimizer(m.parameters(), "
     "optimizer_class=W, lr=1)\n"),
    # the scheduler made from the same module is not an optimiser
    ("from torch import optim\nopt = optim.SGD(m.parameters(), lr=1, momentum=0.9)\n"
     "s = optim.lr_scheduler.StepLR(opt, 1)\n",
     "from torch import optim\nfrom torch.distributed.optim import ZeroRedundancyOptimizer\n"
     "opt = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=optim.SGD, lr=1, "
     "momentum=0.9)\ns = optim.lr_scheduler.StepLR(opt, 1)\n"),
    # not safe to wrap: the learning rate by position, two optimisers, FSDP's parameters
    ("import torch\nopt = torch.optim.Adam(m.parameters(), 1e-3)\n", None),
    ("import torch\na = torch.optim.Adam(m.parameters())\nb = torch.optim.Adam(n.parameters())\n",
     None),
    ("import torch\nfrom torch.distributed.fsdp import fully_shard\nfully_shard(m)\n"
     "opt = torch.optim.Adam(m.parameters(), lr=1)\n", None),
])
def test_the_remedy_partitions_the_one_optimisers_state(source, edited):
    from distdoctor.fixing.remedies import REMEDIES

    assert REMEDIES["over-memory-budget"](source, 2) == edited


def test_without_a_budget_no_hook_is_installed(monkeypatch):
    """Nothing is measured, and nothing of torch is touched, unless the user gave a budget;
    with one, a post-step hook (torch's global registry) is."""
    from torch.optim import optimizer

    from distdoctor.trace.memory import BUDGET_ENV, record_memory
    from distdoctor.trace.tracer import Tracer

    hooks = optimizer._global_optimizer_post_hooks
    before = len(hooks)
    for unset in ("", "0", "-5", "lots"):
        monkeypatch.setenv(BUDGET_ENV, unset)
        record_memory(Tracer(-1, 0))
        assert len(hooks) == before, unset
    monkeypatch.setenv(BUDGET_ENV, "240000")
    kept = dict(hooks), dict(optimizer._global_optimizer_pre_hooks)
    try:
        record_memory(Tracer(-1, 0))
        assert len(hooks) > before
    finally:  # torch's registries as they were
        hooks.clear()
        hooks.update(kept[0])
        optimizer._global_optimizer_pre_hooks.clear()
        optimizer._global_optimizer_pre_hooks.update(kept[1])


def test_damaged_memory_evidence_is_left_out():
    good = {"ev": "memory_held", "step": 1, "budget": 240000, "world_size": 2,
            "params": WHOLE, "grads": WHOLE, "optimizer": ADAM, "stage": 0,
            "model_params": ELEMENTS, "largest": 4096, "tensors": TENSORS, "stepped": 8}
    damaged = [{**good, "params": -1}, {**good, "grads": "many"}, {**good, "stage": True},
               {k: v for k, v in good.items() if k != "budget"}]
    [kept] = fold_memory([good, *damaged])
    assert kept.total == 2 * WHOLE + ADAM and kept.budget == 240000


def test_the_exercise_is_over_its_budget_by_the_models_own_bytes():
    """The exercise's budget sits between what DDP holds and what its fix holds, with a
    margin either way: the grade does not hang on a few bytes."""
    chosen = exercise("over-memory-budget")
    assert "nn.Linear(64, 64)" in chosen.source()
    partitioned = 2 * WHOLE + ADAM / 2  # ZeroRedundancyOptimizer, 2 or 3 ranks: 2 of 4 layers
    assert partitioned * 1.1 < chosen.memory_budget < (2 * WHOLE + ADAM) / 1.1


@pytest.mark.tier("e2e")
@pytest.mark.timeout(300)
def test_a_user_rank_measures_what_it_holds_against_the_budget(distdoctor, tmp_path):
    """FSDP2 on 2 ranks holds half of every state: over 100 KB, told the ranks that fit;
    within 240 KB, OK. The exercise's DDP script
    holds every state whole, and run --fix partitions its optimiser's, verified."""
    report = tmp_path / "report.json"
    script = str(LAUNCHED / "fsdp_adam.py")
    over = distdoctor("run", "--memory-budget", "100KB", "--report", str(report), script)
    assert over.returncode == 1, over.stdout + over.stderr
    cause = json.loads(report.read_text())["cause"]
    assert cause["kind"] == "over-memory-budget" and cause["ranks"] == [0, 1]
    assert cause["measured"]["states"] == {"params": WHOLE // 2, "grads": WHOLE // 2,
                                           "optimizer": ADAM // 2 + 2 * TENSORS,
                                           "gathered": 0}
    assert cause["measured"]["stage"] == 3
    assert "fully_shard (FSDP2, ZeRO-3) on 3 ranks" in cause["fix"]
    within = distdoctor("run", "--memory-budget", "240KB", "--report", str(report), script)
    assert within.returncode == 0, within.stdout
    ddp = tmp_path / "ddp.py"
    ddp.write_text(exercise("over-memory-budget").source())
    patch = tmp_path / "fix.diff"
    over = distdoctor("run", "--memory-budget", "240KB", "--report", str(report), "--fix",
                      "--patch", str(patch), str(ddp))
    assert over.returncode == 1
    measured = json.loads(report.read_text())["cause"]["measured"]
    assert measured["states"] == {"params": WHOLE, "grads": WHOLE, "optimizer": ADAM,
                                  "gathered": 0} and measured["stage"] == 0
    # the patch wraps its Adam in ZeroRedundancyOptimizer, and its re-run under the same
    # budget is OK
    assert "verified, the patched copy reports OK (over-memory-budget gone" in over.stdout
    assert "+optimizer = ZeroRedundancyOptimizer(model.parameters(), " \
        "optimizer_class=torch.optim.Adam, lr=1e-3)" in patch.read_text()
