"""``distdoctor run --fix``'s remedies, each edit on its own: only the lines it changes
(formatting and comments kept byte for byte), and the shapes it must leave alone."""

from __future__ import annotations

import pytest

from distdoctor.fixing.collectives import alternate_the_pair, evaluate_the_module
from distdoctor.fixing.data import set_the_epoch, shard_the_loader
from distdoctor.fixing.gradients import (
    average_the_sum,
    sync_the_last,
    sync_the_last_instead,
    wait_before_step,
)
from distdoctor.fixing.guards import (
    agree_on_the_skip,
    agree_on_the_steps,
    join_the_uneven,
    out_of_the_guard,
)
from distdoctor.fixing.remedies import REMEDIES
from distdoctor.fixing.replicas import (
    broadcast_after_construction,
    broadcast_the_buffers,
    find_unused,
)

pytestmark = pytest.mark.tier("unit")

SUMMED = '''import torch.distributed as dist
for step in range(3):   # odd   spacing kept
    for p in params:
        dist.all_reduce( p.grad )  # summed
    opt.step()
'''


def test_the_sum_is_divided_on_the_next_line_and_nothing_else_changes():
    edited = average_the_sum(SUMMED, 4)
    assert edited is not None
    lines = SUMMED.splitlines(True)
    assert edited.splitlines(True) == [*lines[:4], "        p.grad /= dist.get_world_size()\n",
                                       *lines[4:]]
    grouped = SUMMED.replace("dist.all_reduce( p.grad )", "dist.all_reduce(p.grad, group=g)")
    assert "p.grad /= dist.get_world_size(g)\n" in (average_the_sum(grouped, 4) or "")


@pytest.mark.parametrize("call", [
    "dist.all_reduce(p.grad, op=dist.ReduceOp.MAX)",  # not a sum
    "dist.all_reduce(p.grad, async_op=True)",  # waited on elsewhere
    "all_reduce(p.grad)",  # no module to ask the size of
])
def test_a_reduction_it_does_not_know_is_left_alone(call):
    assert average_the_sum(SUMMED.replace("dist.all_reduce( p.grad )", call), 4) is None
    one_line = "import torch.distributed as dist\nfor p in ps: dist.all_reduce(p.grad)\n"
    assert average_the_sum(one_line, 2) is None


EPOCHS = '''sampler = DistributedSampler(data)
loader = DataLoader(data, sampler=sampler, batch_size=8)
for epoch in range(3):
    # a comment kept where it was
    for x in loader:
        step(x)
'''


def test_the_epoch_is_set_in_the_loop_around_the_loader_just_before_the_loader():
    edited = set_the_epoch(EPOCHS, 5)
    lines = EPOCHS.splitlines(True)
    assert edited is not None and edited.splitlines(True) == [
        *lines[:4], "    sampler.set_epoch(epoch)\n", *lines[4:]]
    assert set_the_epoch(EPOCHS.replace("for epoch in range(3):\n    # a comment kept where "
                                        "it was\n", "if True:\n"), 4) is None  # no epoch loop
    told = EPOCHS.replace("    # a comment", "    sampler.set_epoch(0)\n    # a comment")
    assert set_the_epoch(told, 6) is None  # told a constant: the student's mistake, by hand


def test_a_sampler_made_anew_each_epoch_is_told_the_epoch_once_it_exists():
    """examples/loader_per_epoch.py's shape: at the head of the epoch the sampler would
    not exist yet (a NameError in epoch 0; run --fix's verifying run caught it so)."""
    made = ("for epoch in range(3):\n    model.train()\n"
            "    sampler = DistributedSampler(data)\n"
            "    loader = DataLoader(data, sampler=sampler)\n    for x in loader:\n"
            "        step(x)\n")
    assert set_the_epoch(made, 5) == made.replace(
        "    for x", "    sampler.set_epoch(epoch)\n    for x")


WRAPPED = '''from torch.nn.parallel import DistributedDataParallel as DDP
model = DDP(
    Model(),  # the net
    device_ids=None,
)
loss = model(x).sum()
'''


def test_ddp_is_told_to_find_unused_parameters_where_it_is_made():
    edited = find_unused(WRAPPED, 6)
    assert edited == WRAPPED.replace(  # one per line, as the others are
        "    device_ids=None,\n", "    device_ids=None,\n    find_unused_parameters=True,\n")
    alone = "m = DDP(\n    Model(),  # c\n)\n"  # its comment stays with it
    assert find_unused(alone, 1) == "m = DDP(\n    Model(),  # c\n    " \
        "find_unused_parameters=True,\n)\n"
    one_line = "model = nn.parallel.DistributedDataParallel(Model())  # bug\n"
    assert find_unused(one_line, 1) == \
        "model = nn.parallel.DistributedDataParallel(Model(), find_unused_parameters=True)" \
        "  # bug\n"
    told = one_line.replace("Model()", "Model(), find_unused_parameters=False")
    assert find_unused(told, 1) is None  # said False on purpose: the user's call
    assert find_unused(one_line * 2, 1) is None  # two wrappers: which one is not ours to say


ASYNC = '''for step in range(3):
    handle = dist.all_reduce(grad, async_op=True)
    other_work()

    opt.step()  # the step
'''


def test_an_unwaited_work_is_waited_just_before_the_step():
    assert wait_before_step(ASYNC, 2, (5,)) == ASYNC.replace(
        "\n    opt.step()", "\n    handle.wait()\n    opt.step()")
    listed = ASYNC.replace("handle = dist.all_reduce(grad, async_op=True)",
                           "works.append(dist.all_reduce(grad, async_op=True))")
    assert wait_before_step(listed, 2, (5,)) == listed.replace(
        "\n    opt.step()", "\n    for work in works:\n        work.wait()\n    opt.step()")
    assert wait_before_step(ASYNC, 2, ()) is None  # no step named: nowhere to wait
    waited = ASYNC.replace(", async_op=True", "")
    assert wait_before_step(waited, 2, (5,)) is None  # not asynchronous: another cause


SEEDED = '''import torch.distributed as d
torch.manual_seed(d.get_rank())
net = make()
opt = SGD(net.parameters(), lr=0.1)
'''


def test_the_model_is_broadcast_from_rank_0_right_after_it_is_made():
    assert broadcast_after_construction(SEEDED, 4) == SEEDED.replace(
        "net = make()\n", "net = make()\nfor tensor in net.state_dict().values():\n"
        "    d.broadcast(tensor, src=0)\n")
    two = SEEDED + "opt2 = SGD(other.parameters(), lr=0.1)\n"
    assert broadcast_after_construction(two, 4) is None  # which model: the user's to say
    plain = SEEDED.replace("import torch.distributed as d", "from torch import distributed")
    assert broadcast_after_construction(plain, 4) is None  # no module name to call by


CYCLE = '''import torch.distributed as dist
def exchange(x, y, peer):
    dist.send(x, peer)  # first
    dist.recv(y, peer)
'''


def test_a_send_and_receive_side_by_side_are_ordered_by_the_ranks_parity():
    assert alternate_the_pair(CYCLE, 3) == CYCLE.replace(
        "    dist.send(x, peer)  # first\n    dist.recv(y, peer)\n",
        "    if dist.get_rank() % 2 == 0:\n        dist.send(x, peer)  # first\n"
        "        dist.recv(y, peer)\n    else:\n        dist.recv(y, peer)\n"
        "        dist.send(x, peer)\n")
    apart = CYCLE.replace("    dist.recv", "    log()\n    dist.recv")
    assert alternate_the_pair(apart, 3) is None  # not side by side: not ours to reorder
    waited = CYCLE.replace("dist.send(x, peer)", "dist.isend(x, peer).wait()")
    assert alternate_the_pair(waited, 3) is None


SHARED = '''import torch
loader = torch.utils.data.DataLoader(
    data,
    shuffle=True,
    batch_size=4,
)
for epoch in range(2):
    for batch in loader:
        step(batch)
'''


def test_a_shared_loader_is_given_a_sampler_of_its_dataset_and_told_the_epoch():
    edited = shard_the_loader(SHARED.replace("torch.utils.data.DataLoader", "DataLoader"), 8)
    assert edited is not None
    assert "sampler = torch.utils.data.DistributedSampler(data, shuffle=True)\n" in edited
    assert "    batch_size=4,\n    sampler=sampler,\n)\n" in edited and "shuffle=True,\n" \
        not in edited.split("DistributedSampler", 1)[1]
    assert "for epoch in range(2):\n    sampler.set_epoch(epoch)\n" in edited
    given = SHARED.replace("shuffle=True", "sampler=mine")
    assert shard_the_loader(given.replace("torch.utils.data.DataLoader", "DataLoader"),
                            8) is None  # a sampler of the user's own: theirs to shard


EVALUATED = '''import torch
model = DDP(net)
for step in range(3):
    train(model)
    if rank == 0:
        print(model(x).mean())
'''


def test_an_evaluation_on_one_rank_calls_the_wrapped_module_without_a_graph():
    assert evaluate_the_module(EVALUATED, 6) == EVALUATED.replace(
        "        print(model(x).mean())\n",
        "        with torch.no_grad():\n            print(model.module(x).mean())\n")
    assert evaluate_the_module(EVALUATED, 4) is None  # on every rank: not this cause
    barrier = EVALUATED.replace("print(model(x).mean())", "dist.barrier()")
    assert evaluate_the_module(barrier, 6) is None  # another shape of the mismatch


ACCUMULATED = '''"""A script."""
from __future__ import annotations

import torch
net = DDP(make())
for step in range(2):
    for micro in range(steps):
        loss = net(x[micro])
        loss.backward()
    opt.step()
'''


def test_every_micro_batch_but_the_last_runs_inside_no_sync():
    edited = sync_the_last(ACCUMULATED, 8)
    imported = ACCUMULATED.replace("\nimport torch\n", "\nimport contextlib\nimport torch\n")
    assert edited == imported.replace(
        "        loss = net(x[micro])\n        loss.backward()\n",
        "        with net.no_sync() if micro < steps - 1 else contextlib.nullcontext():\n"
        "            loss = net(x[micro])\n            loss.backward()\n")
    no_backward = ACCUMULATED.replace("        loss.backward()\n", "")
    assert sync_the_last(no_backward, 8) is None  # nothing to keep from synchronising
    listed = ACCUMULATED.replace("range(steps)", "batches")
    assert sync_the_last(listed, 8) is None  # which one is last: not said by a count


def test_the_verified_copy_holds_the_scripts_code_and_nothing_else(tmp_path):
    """The patched copy is run from a copy of what the script can import beside it: its
    sibling modules and packages, never the rest of the folder (a home folder's data)."""
    from distdoctor.fixing.patches import Proposal, verify

    (tmp_path / "train.py").write_text("import helpers\n")
    (tmp_path / "helpers.py").write_text("x = 1\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "data.bin").write_bytes(b"\0" * 10)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "big.py").write_text("")  # a folder, but no package
    (tmp_path / "notes.txt").write_text("")
    seen = []

    def rerun(patched):
        seen.extend(sorted(str(p.relative_to(patched.parent))
                           for p in patched.parent.rglob("*")))
        return "OK", []

    proposal = Proposal(tmp_path / "train.py", "import helpers\n", "import helpers  # x\n",
                        ("sum-without-mean",))
    outcome = verify(proposal, "train.py", rerun, ["sum-without-mean"])
    assert outcome.verified and seen == ["helpers.py", "pkg", "pkg/__init__.py", "train.py"]


@pytest.mark.parametrize(("said", "verified", "runs"), [
    ([("FAILED: straggler (rank 0)", ["straggler"]), ("OK", []), ("OK", [])], True, 3),
    ([("FAILED: straggler (rank 0)", ["straggler"]), ("OK", []),
      ("FAILED: straggler (rank 2)", ["straggler"])], False, 3),
    ([("FAILED: straggler (rank 0)", ["straggler"])] * 2, False, 2),
    ([("FAILED: divergent-parameters (rank 1)", ["divergent-parameters"])], False, 1),
    ([("OK", [])], True, 1),
])
def test_a_timing_cause_a_fixs_rerun_adds_stands_only_once_a_second_run_raises_it(
        tmp_path, said, verified, runs):
    """The suite under a busy loop on every core once saw the healthy rerun of a fix
    called a straggler, and the fix refused. A timing cause the first run did not raise
    is run again until two reruns agree (an alarm twice, or quiet more often than not);
    any other cause decides at once. The reruns are made-up verdicts:
    what is tested is the rule (the fix tests run real ones)."""
    from distdoctor.cli.fix import timing_confirmed
    from distdoctor.fixing.patches import Proposal, verify

    (tmp_path / "train.py").write_text("x = 1\n")
    answers = iter(said)
    made = []

    def rerun(patched):
        made.append(patched)
        return next(answers)

    before = ["rank-dependent-update"]
    proposal = Proposal(tmp_path / "train.py", "x = 1\n", "x = 2\n", tuple(before))
    outcome = verify(proposal, "train.py", timing_confirmed(rerun, before), before)
    assert (outcome.verified, len(made)) == (verified, runs)
    assert outcome.rerun == said[-1][0]


GUARDED = '''import os
import torch.distributed as dist
main = int(os.environ["RANK"]) == 0
for step in range(4):
    train()
    if main and step % 2 == 0:  # every other step
        best = dist.all_reduce(metric)
        print(best)
        saved = load(path)
        opt.load_state_dict(saved)  # the state
'''


def test_a_call_under_a_rank_guard_is_made_on_every_rank_with_what_it_needs():
    """The rank is known through a name bound to what names it (``main``); the rest of
    the condition still guards the call; what the call needs moves with it; what it does
    not stays under the guard."""
    assert out_of_the_guard(GUARDED, 7) == GUARDED.replace(
        "    if main and step % 2 == 0:  # every other step\n"
        "        best = dist.all_reduce(metric)\n",
        "    if step % 2 == 0:\n        best = dist.all_reduce(metric)\n"
        "    if main and step % 2 == 0:  # every other step\n")
    moved = out_of_the_guard(GUARDED, 10)
    assert moved is not None and moved.splitlines()[5:11] == [
        "    if step % 2 == 0:", "        saved = load(path)",
        "        opt.load_state_dict(saved)  # the state",
        "    if main and step % 2 == 0:  # every other step",
        "        best = dist.all_reduce(metric)", "        print(best)"]


def test_the_shapes_a_guard_remedy_leaves_alone():
    assert out_of_the_guard(GUARDED, 5) is None  # not under a guard
    not_rank = GUARDED.replace("main and step % 2 == 0", "step % 2 == 0")
    assert out_of_the_guard(not_rank, 7) is None  # a guard, but not the rank's
    one_sided = "import torch.distributed as dist\nif dist.get_rank() == 0:\n" \
        "    dist.barrier()\nelse:\n    other()\n"
    assert out_of_the_guard(one_sided, 3) is None  # an else, its if left empty
    assert out_of_the_guard(one_sided.replace("    dist.barrier()\n",
                                              "    dist.barrier()\n    log()\n"), 3) \
        == one_sided.replace("if dist", "dist.barrier()\nif dist").replace(
            "    dist.barrier()\n", "    log()\n")


SKIPPED = '''import math
import torch
import torch.distributed as dist
for batch in loader:
    loss = model(batch)
    # a bad batch
    if not math.isfinite(loss.item()):
        print("skipping")
        continue
    loss.backward()
'''


def test_a_skip_one_rank_decides_is_agreed_by_every_rank_first():
    assert agree_on_the_skip(SKIPPED, 9) == SKIPPED.replace(
        "    if not math.isfinite(loss.item()):\n",
        "    skip = torch.tensor([float(not math.isfinite(loss.item()))])\n"
        "    dist.all_reduce(skip, op=dist.ReduceOp.MAX)\n    if skip.item():\n")
    taken = SKIPPED.replace("loss = model(batch)", "skip = model(batch)")
    assert "skip_flag = torch.tensor(" in (agree_on_the_skip(taken, 9) or "")
    assert agree_on_the_skip(SKIPPED, 8) is None  # a print, not a skip
    assert agree_on_the_skip(SKIPPED.replace("import torch\n", ""), 9) is None


COUNTED = '''import torch
import torch.distributed as dist
for step in range(len(shard)):
    dist.all_reduce(grad)
'''


def test_a_loop_as_long_as_each_ranks_shard_runs_the_fewest_steps_of_any():
    assert agree_on_the_steps(COUNTED, 4) == COUNTED.replace(
        "for step in range(len(shard)):\n",
        "steps = torch.tensor([len(shard)])\n"
        "dist.all_reduce(steps, op=dist.ReduceOp.MIN)\n"
        "for step in range(int(steps.item())):\n")
    assert agree_on_the_steps(COUNTED.replace("len(shard)", "6"), 4) is None  # fixed


def test_a_forward_under_a_guard_is_evaluated_before_any_call_moves_out_of_it():
    """collective-mismatch has several shapes: the most specific remedy is tried first."""
    cure = REMEDIES["collective-mismatch"]
    assert cure(EVALUATED, 6) == evaluate_the_module(EVALUATED, 6)
    barrier = EVALUATED.replace("print(model(x).mean())", "dist.barrier()")
    assert cure(barrier, 6) == out_of_the_guard(barrier, 6)


def test_buffers_kept_apart_are_broadcast_again_and_nothing_else():
    told = "model = DDP(net, broadcast_buffers=False)  # keep\n"
    assert broadcast_the_buffers(told, 1) == told.replace("False", "True")
    assert broadcast_the_buffers(told.replace("False", "True"), 1) is None
    assert broadcast_the_buffers(told + told.replace("model", "other"), 1) is None  # which?


ACCUMULATED_OFF = '''for micro in range(steps):
    with net.no_sync() if micro != 0 else nullcontext():
        net(x[micro]).backward()
'''


def test_the_micro_batch_that_synchronises_becomes_the_last():
    assert sync_the_last_instead(ACCUMULATED_OFF, 3) == ACCUMULATED_OFF.replace(
        "micro != 0", "micro < steps - 1")
    assert sync_the_last_instead(ACCUMULATED_OFF.replace("micro != 0", "micro < steps - 1"),
                                 3) is None  # right already: the cause is elsewhere
    always = "for micro in range(4):\n    with net.no_sync():\n        net(x).backward()\n"
    assert sync_the_last_instead(always, 3) is None  # never synced: the user's to decide


UNEVEN = '''import torch
from torch.nn.parallel import DistributedDataParallel as DDP
model = DDP(net)
for epoch in range(2):
    for batch in shard:
        model(batch).sum().backward()
'''


def test_a_ddp_loop_over_uneven_shards_is_joined():
    assert join_the_uneven(UNEVEN, 6) == UNEVEN.replace(
        "DDP\n", "DDP\nfrom torch.distributed.algorithms.join import Join\n").replace(
        "    for batch in shard:\n        model(batch).sum().backward()\n",
        "    with Join([model]):\n        for batch in shard:\n"
        "            model(batch).sum().backward()\n")
    assert join_the_uneven(UNEVEN.replace("model(batch)", "net(batch)"), 6) is None  # no DDP
    assert join_the_uneven(join_the_uneven(UNEVEN, 6) or "", 8) is None  # joined already


def test_a_file_changed_since_its_patch_was_made_is_never_written(tmp_path):
    from distdoctor.fixing.patches import Proposal, apply

    script = tmp_path / "train.py"
    script.write_text("x = 2  # edited meanwhile\n")
    with pytest.raises(OSError, match="changed while its patch was verified: not applied"):
        apply(Proposal(script, "x = 1\n", "x = 1 / 2\n", ("sum-without-mean",)))
    assert script.read_text() == "x = 2  # edited meanwhile\n"
    assert not script.with_name("train.py.orig").exists()


def test_a_sampler_made_inline_is_told_the_epoch_through_its_loader():
    inline = ("loader = DataLoader(data, sampler=DistributedSampler(data))\n"
              "for epoch in range(3):\n    for x in loader:\n        train(x)\n")
    assert set_the_epoch(inline, 3) == inline.replace(
        "range(3):\n", "range(3):\n    loader.sampler.set_epoch(epoch)\n")
    told = inline.replace("        train(x)\n",
                          "        train(x)\n    loader.sampler.set_epoch(0)\n")
    assert set_the_epoch(told, 3) is None  # told (a constant): the user's to mend


def test_a_guard_through_the_scripts_own_rank_function_is_a_rank_guard():
    """``def is_main(): return dist.get_rank() == 0`` and accelerate's attribute."""
    helper = ("import torch.distributed as dist\ndef is_main():\n"
              "    return dist.get_rank() == 0\nif is_main():\n    dist.barrier()\n")
    assert out_of_the_guard(helper, 5) == helper.replace(
        "if is_main():\n    dist.barrier()\n", "dist.barrier()\n")
    accelerated = "if accelerator.is_main_process:\n    accelerator.wait_for_everyone()\n"
    assert out_of_the_guard(accelerated, 2) == "accelerator.wait_for_everyone()\n"


def test_the_lines_an_edit_touches_are_read_from_the_two_sources():
    """What the plugin checks against the user's build and step before it shows an edit."""
    from distdoctor.testing.oneprocess import _changed_lines

    assert _changed_lines("a\nb\nc\n", "a\nb\nx\nc\n") == [2]  # added after line 2
    assert _changed_lines("a\nb\nc\n", "a\nB\nc\n") == [2]  # line 2 replaced
    assert _changed_lines("a\nb\nc\nd\n", "a\nd\n") == [2, 3]  # lines 2-3 removed
