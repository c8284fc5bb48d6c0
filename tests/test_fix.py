"""``distdoctor run --fix`` through the real command: a patch offered only once the patched
copy, re-run on real ranks, no longer reports what it cures; healthy scripts get none; a
wrong edit is never offered and never applied; a cause no edit can cure is said so."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from lanes import Job, Step

from distdoctor.fixing import remedies
from distdoctor.fixing.gradients import average_the_sum

pytestmark = pytest.mark.tier("e2e")

EXAMPLES = Path(__file__).parent.parent / "examples"


def fix_run(distdoctor, tmp_path, example: str, ranks: int, *flags: str):
    """``run --fix`` on a copy of an example (so --apply may write), its stdout and JSON."""
    folder = tmp_path / "project"
    folder.mkdir()
    shutil.copy(EXAMPLES / example, folder / example)
    report = tmp_path / "report.json"
    done = distdoctor("run", "--nproc-per-node", str(ranks), "--fix", "--report", str(report),
                      *flags, str(folder / example))
    return done, json.loads(report.read_text()), folder / example


DDP_LINE = "model = nn.parallel.DistributedDataParallel(Model()"
SEND = "dist.send(outgoing, dst=(rank + 1) % world)"
RECV = "dist.recv(incoming, src=(rank - 1) % world)"
EVAL_NOTE = "# BUG: model.module(...) or no_grad()"
CLIP = "norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # BUG: rank 0 only"
SCHEDULE = "scheduler.step()  # BUG: the schedule advances on rank 0 alone"
LOAD = ["state = torch.load(checkpoint)",
        "optimizer.load_state_dict(state[\"optimizer\"])  # BUG: rank 0's momentum alone"]
GATHER = "state = {k: v.full_tensor() for k, v in net.state_dict().items()}  # BUG: rank 0 only"
STEPS = ["steps = torch.tensor([batches])", "dist.all_reduce(steps, op=dist.ReduceOp.MIN)"]
NULL = "contextlib.nullcontext()"
SKIP = ["skip = torch.tensor([float(not math.isfinite(loss.item()))])",
        "dist.all_reduce(skip, op=dist.ReduceOp.MAX)"]

# (example, ranks, the cause its patch cures, the diff's changed lines, no other)
CASES = [
    ("summed_gradients.py", 3, "sum-without-mean",
     ["+        p.grad /= dist.get_world_size()"]),
    ("epoch_not_set.py", 2, "repeated-epoch-order", ["+    sampler.set_epoch(epoch)"]),
    # the sampler made anew each epoch: told once it exists, just before the loop
    ("loader_per_epoch.py", 2, "repeated-epoch-order", ["+    sampler.set_epoch(epoch)"]),
    ("ddp_unused_params.py", 2, "unused-params",
     [f"-{DDP_LINE})  # BUG: find_unused_parameters=False",
      f"+{DDP_LINE}, find_unused_parameters=True)  # BUG: find_unused_parameters=False"]),
    ("unwaited_async_allreduce.py", 2, "failed-sync",  # (the replicas' parting follows)
     ["+    for work in works:", "+        work.wait()"]),
    ("p2p_cycle.py", 3, "p2p-cycle",  # (a ring of three: two even ranks side by side)
     [f"-{SEND}  # BUG: everyone sends first", f"-{RECV}",
      "+if dist.get_rank() % 2 == 0:", f"+    {SEND}  # BUG: everyone sends first",
      f"+    {RECV}", "+else:", f"+    {RECV}", f"+    {SEND}"]),
    ("no_distributed_sampler.py", 2, "duplicate-samples",
     ["-from torch.utils.data import DataLoader, TensorDataset",
      "+from torch.utils.data import DataLoader, TensorDataset, DistributedSampler",
      "-loader = DataLoader(data, batch_size=8, shuffle=True)  # BUG: no DistributedSampler",
      "+sampler = DistributedSampler(data, shuffle=True)",
      "+loader = DataLoader(data, batch_size=8, sampler=sampler)  # BUG: no DistributedSampler",
      "+    sampler.set_epoch(epoch)"]),
    ("eval_on_rank0_through_ddp.py", 2, "collective-mismatch",
     [f"-        score = model(torch.randn(16, 8)).mean()  {EVAL_NOTE}",
      "+        with torch.no_grad():",
      f"+            score = model.module(torch.randn(16, 8)).mean()  {EVAL_NOTE}"]),
    ("accumulate_without_no_sync.py", 2, "allreduce-every-microbatch",
     ["+import contextlib", "-        loss = model(batch).pow(2).mean() / 4  # FORWARD",
      "-        loss.backward()",
      "+        with model.no_sync() if micro < 3 else contextlib.nullcontext():",
      "+            loss = model(batch).pow(2).mean() / 4  # FORWARD",
      "+            loss.backward()"]),
    ("own_seed_no_broadcast.py", 3, "divergent-parameters",
     ["+for tensor in model.state_dict().values():", "+    dist.broadcast(tensor, src=0)"]),
    # a call under a rank guard, made on every rank (the rest of the condition kept)
    ("ddp_barrier_on_rank0.py", 2, "collective-mismatch",
     ["-    if dist.get_rank() == 0 and step == 1:", "+    if step == 1:"]),
    ("rank_zero_metric.py", 2, "collective-mismatch",
     ["-    if rank == 0 and step == 1:", "+    if step == 1:"]),
    ("ddp_log_on_rank0.py", 2, "collective-mismatch",
     ["-    if dist.get_rank() == 0:",
      "-        dist.all_reduce(loss.detach())  # BUG: a collective only rank 0 makes",
      "+    dist.all_reduce(loss.detach())  # BUG: a collective only rank 0 makes"]),
    ("conditional_collective.py", 2, "collective-mismatch",
     ["-if dist.get_rank() == 0:",
      "-    dist.all_reduce(metrics)  # BUG: a collective only rank 0 calls",
      "+dist.all_reduce(metrics)  # BUG: a collective only rank 0 calls"]),
    ("mesh_metric_on_rank0.py", 2, "collective-mismatch",
     ["-if dist.get_rank() == 0:",
      "-    dist.all_reduce(metric)  # BUG: a collective only rank 0 makes",
      "+dist.all_reduce(metric)  # BUG: a collective only rank 0 makes"]),
    ("fsdp_checkpoint_on_rank0.py", 2, "collective-mismatch",
     ["-if dist.get_rank() == 0:", f"-    {GATHER}", f"+{GATHER}"]),
    ("group_on_subset.py", 4, "collective-mismatch",  # (group creation is a collective)
     ["-if rank < 2:", "-    pair = dist.new_group([0, 1])  # BUG: only its members make it",
      "+pair = dist.new_group([0, 1])  # BUG: only its members make it"]),
    ("clip_on_rank0.py", 2, "rank-dependent-update", [f"+    {CLIP}", f"-        {CLIP}"]),
    ("scheduler_on_rank_0.py", 2, "rank-dependent-update",
     [f"+    {SCHEDULE}", f"-        {SCHEDULE}"]),
    ("resume_optimizer_on_rank0.py", 2, "rank-dependent-update",  # (with what it needs)
     [f"+{LOAD[0]}", f"+{LOAD[1]}", f"-    {LOAD[0]}", f"-    {LOAD[1]}"]),
    ("batchnorm_buffers_not_broadcast.py", 2, "divergent-buffers",
     ["-model = DDP(net, broadcast_buffers=False)  # BUG: and no SyncBatchNorm",
      "+model = DDP(net, broadcast_buffers=True)  # BUG: and no SyncBatchNorm"]),
    ("accumulate_sync_on_first.py", 2, "unsynced-microbatches",
     [f"-        with model.no_sync() if micro > 0 else {NULL}:  # BUG: micro < 3",
      f"+        with model.no_sync() if micro < 3 else {NULL}:  # BUG: micro < 3"]),
    # a decision one rank makes alone, agreed by an all-reduce first
    ("skip_step_on_nonfinite_loss.py", 2, "partial-step",
     ["-    if not math.isfinite(loss.item()):", f"+    {SKIP[0]}", f"+    {SKIP[1]}",
      "+    if skip.item():"]),
    ("ddp_uneven_inputs.py", 2, "rank-exited-early",  # (DDP's answer: Join)
     ["+from torch.distributed.algorithms.join import Join",
      "-for batch in batches:", "-    optimizer.zero_grad()",
      "-    model(batch).pow(2).mean().backward()  # BACKWARD", "-    optimizer.step()",
      "+with Join([model]):", "+    for batch in batches:", "+        optimizer.zero_grad()",
      "+        model(batch).pow(2).mean().backward()  # BACKWARD",
      "+        optimizer.step()"]),
    ("data_ran_out.py", 2, "rank-exited-early",
     ["-for step in range(batches):", f"+{STEPS[0]}", f"+{STEPS[1]}",
      "+for step in range(int(steps.item())):"]),
]


METRIC = "dist.all_reduce(loss.detach())  # BUG: a collective on rank 0 only"
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "3", "summed_gradients.py")
# run --fix -- COMMAND: (the example, distdoctor's options, the command, the cause its
# patch cures, the diff's changed lines); the command runs in a folder holding the example
COMMANDS = [
    ("selflaunch/spawn_metric_on_rank0.py", ("--deadline", "3"),  # (mp.spawn)
     (sys.executable, "selflaunch/spawn_metric_on_rank0.py"), "collective-mismatch",
     [f"+        {METRIC}", f"-            {METRIC}"]),
    ("selflaunch/spawn_summed_gradients.py", (),  # (two groups, one mp.spawn each: both)
     (sys.executable, "selflaunch/spawn_summed_gradients.py"), "sum-without-mean",
     ["+            p.grad /= dist.get_world_size()"]),
    ("summed_gradients.py", (), TORCHRUN, "sum-without-mean",
     ["+        p.grad /= dist.get_world_size()"]),
]


def _command_job(number: int) -> str:
    return f"run --fix -- {' '.join(COMMANDS[number][2][1:])}"


def _command_jobs(root: Path) -> list[Job]:
    jobs = []
    for number, (example, options, command, _, _) in enumerate(COMMANDS):
        base = root / f"c{number}"
        (base / "project" / example).parent.mkdir(parents=True)
        shutil.copy(EXAMPLES / example, base / "project" / example)
        argv = (sys.executable, "-m", "distdoctor", "run", *options, "--fix", "--apply",
                "--report", str(base / "report.json"), "--", *command)
        jobs.append(Job(_command_job(number), (Step("fix", argv, str(base / "project"),
                                                    {"TMPDIR": str(base)}, timeout=300.0),)))
    wrapped = root / "wrapped"  # a command that names no script: a shell runs torchrun
    (wrapped / "project").mkdir(parents=True)
    shutil.copy(EXAMPLES / "summed_gradients.py", wrapped / "project")
    jobs.append(Job("run --fix -- sh -c torchrun", (Step("fix", (
        sys.executable, "-m", "distdoctor", "run", "--fix", "--apply", "--report",
        str(wrapped / "report.json"), "--", "sh", "-c", " ".join(TORCHRUN)),
        str(wrapped / "project"), {"TMPDIR": str(wrapped)}, timeout=300.0),)))
    return jobs


@pytest.mark.timeout(900)  # the first test may wait for its job
@pytest.mark.parametrize("number", range(len(COMMANDS)), ids=[c[0] for c in COMMANDS])
def test_a_command_is_re_run_the_same_way_with_its_patched_copy(lanes, number):
    """run --fix -- COMMAND, whatever launches the ranks (mp.spawn, torchrun): the same
    command re-run with the patched copy in place of the script it names."""
    example, _, _, cures, changed = COMMANDS[number]
    done = lanes.result(_command_job(number))["fix"]
    project = Path(lanes.job(_command_job(number)).steps[0].cwd)
    report = json.loads((project.parent / "report.json").read_text())
    assert done.returncode == 1, done.stdout[-3000:]
    [fix] = report["fixes"]
    assert (fix["cures"], fix["verified"], fix["rerun"]) == ([cures], True, "OK"), \
        done.stdout[-3000:]
    assert [line for line in fix["diff"].splitlines()
            if line[:1] in "+-" and line[:3] not in ("+++", "---")] == changed
    assert fix["diff"].startswith(f"--- a/{example}\n+++ b/{example}\n")
    assert (project / (example + ".orig")).read_text() == (EXAMPLES / example).read_text()
    assert fix["applied"] == str(project / (example + ".orig"))
    # the re-run is quiet: torchrun's warning is the first run's alone
    assert done.stderr.count("Setting OMP_NUM_THREADS") == (COMMANDS[number][2] == TORCHRUN)


def test_a_command_that_does_not_name_the_script_gets_no_patch(lanes):
    """Behind a shell, the command has no argument to swap for the patched copy: said in
    one line, nothing re-run, nothing applied."""
    done = lanes.result("run --fix -- sh -c torchrun")["fix"]
    project = Path(lanes.job("run --fix -- sh -c torchrun").steps[0].cwd)
    report = json.loads((project.parent / "report.json").read_text())
    assert done.returncode == 1 and report["fixes"] == [], done.stdout[-3000:]
    assert "distdoctor run --fix: the command does not name summed_gradients.py, so a " \
        "patched copy of it cannot be run the same way: no patch is offered" in done.stdout
    assert "re-running" not in done.stdout
    assert not (project / "summed_gradients.py.orig").exists()


def _fix_job(number: int) -> str:
    return f"run --fix {CASES[number][0]} on {CASES[number][1]} ranks"


def lane_jobs(root: Path) -> list[Job]:
    """Each case's ``run --fix --apply`` on a copy of its example, as a background job
    (tests/lanes.py): two runs of real ranks each, the bug's and the patched copy's."""
    jobs = []
    for number, (example, ranks, _, _) in enumerate(CASES):
        base = root / str(number)  # short: TMPDIR is in it (see conftest.py)
        (base / "project").mkdir(parents=True)
        shutil.copy(EXAMPLES / example, base / "project" / example)
        argv = (sys.executable, "-m", "distdoctor", "run", "--nproc-per-node", str(ranks),
                "--fix", "--apply", "--patch", str(base / "fix.patch"), "--report",
                str(base / "report.json"), "--html", str(base / "report.html"),
                str(base / "project" / example))
        jobs.append(Job(_fix_job(number), (Step("fix", argv, str(base), {"TMPDIR": str(base)},
                                                timeout=300.0),)))
    return jobs + _command_jobs(root)


@pytest.mark.timeout(900)  # the first test may wait for its job
@pytest.mark.parametrize("number", range(len(CASES)), ids=[c[0] for c in CASES])
def test_each_mechanical_cause_gets_a_patch_that_verifies_and_applies(lanes, number):
    example, _, cures, changed = CASES[number]
    done = lanes.result(_fix_job(number))["fix"]
    base = Path(lanes.job(_fix_job(number)).steps[0].cwd)
    report = json.loads((base / "report.json").read_text())
    script, patch = base / "project" / example, base / "fix.patch"
    assert done.returncode == 1, done.stdout[-3000:]  # the run it diagnosed had the bug
    [fix] = report["fixes"]
    assert (fix["cures"], fix["verified"], fix["rerun"]) == ([cures], True, "OK"), \
        done.stdout[-3000:]
    assert [line for line in fix["diff"].splitlines()  # the lines it changes, no other
            if line[:1] in "+-" and line[:3] not in ("+++", "---")] == changed
    assert patch.read_text() == fix["diff"] and fix["diff"] in done.stdout
    original = (EXAMPLES / example).read_text()
    assert script.with_name(example + ".orig").read_text() == original
    kept = [line for line in script.read_text().splitlines() if f"+{line}" not in changed]
    assert kept == [line for line in original.splitlines() if f"-{line}" not in changed]
    assert fix["applied"] == str(script.with_name(example + ".orig"))
    page = (base / "report.html").read_text()  # the patch beside the cause it cures
    assert page.index(f'<span class="kind">{cures}</span>') < page.index('<pre class="diff">')
    assert "patch verified: the patched copy reports OK" in page


# every other example: healthy (no finding, so no patch), or its cause no edit is offered
# for, and why (each said in one line by run --fix)
HEALTHY = {"averaged_gradients.py", "sampler_ok.py", "accumulate_with_no_sync.py",
           "clean.py", "tp_clean.py", "tp_sequence_parallel_ok.py", "test_with_distdoctor.py",
           "tp_dp_data_by_dp_rank.py"}
NO_PATCH = {
    "rank_spins.py": "busy-rank: a rank's own work", "tree_broadcast_spins.py": "busy-rank",
    "straggler_extra_compute.py": "straggler", "straggler_rank0_logging.py": "straggler",
    "straggler_slow_loader.py": "straggler", "rank_busy_validation.py": "busy-rank",
    "rank_raises.py": "rank-crashed", "model_width_differs.py": "rank-crashed",
    "nan_in_one_shard.py": "non-finite: where it comes from is the user's",
    "rank_exits.py": "rank-exited-early by sys.exit: a fixed loop, no count to agree",
    "shape_mismatch.py": "collective-mismatch of sizes: which is right is the user's",
    "reduce_op_mismatch.py": "collective-mismatch of ops: which is right is the user's",
    "fsdp_gather_on_rank0_aborts.py": "a guard whose else makes collectives of its own",
    "grads_paired_per_rank_order.py": "failed-sync with no Work to wait for",
    "groups_in_opposite_orders.py": "group-cycle: no remedy yet",
    "lr_from_local_batch.py": "rank-dependent-update with no guard: a setting computed "
                              "from the rank's own share",
    "tp_partial_output.py": "tensor-parallel plans: no remedy yet",
    "tp_sequence_parallel_head.py": "tensor-parallel plans: no remedy yet",
    "tp_dp_data_by_global_rank.py": "tensor-parallel data dealing: no remedy yet",
    "zero_grad_per_microbatch.py": "cleared-microbatches: no remedy yet",
    "tp_mesh_across_nodes.py": "tp-across-nodes: told on several nodes only",
    **{name.name: "a start-up mismatch: the launch, not the script's lines"
       for name in EXAMPLES.glob("startup_*.py")},
}


def test_every_example_is_patched_healthy_or_said_why_not():
    """The examples are the catalogue of a user's bugs: each either has a verified patch
    (CASES), is healthy, or is listed with why no edit is offered."""
    patched = {c[0] for c in CASES}
    assert not patched & (HEALTHY | set(NO_PATCH)) and not HEALTHY & set(NO_PATCH)
    assert {p.name for p in EXAMPLES.glob("*.py")} == patched | HEALTHY | set(NO_PATCH)


def test_uneven_ddp_inputs_name_where_the_others_wait(lanes):
    """DDP's gradient all-reduces are made from C++, untraced: a rank that ran out is
    still named with where the others wait, the forward whose all-reduce has no partner."""
    number = next(i for i, c in enumerate(CASES) if c[0] == "ddp_uneven_inputs.py")
    lanes.result(_fix_job(number))
    base = Path(lanes.job(_fix_job(number)).steps[0].cwd)
    cause = json.loads((base / "report.json").read_text())["cause"]
    assert cause["summary"] == (
        "rank 1 ended after 0 traced calls and 3 DDP training forwards (DDP's own "
        "collectives, not traced) (last: DDP's gradient all-reduce of its training forward "
        "#3 at project/ddp_uneven_inputs.py:19), while the others still expected it: rank 0 "
        "in DDP's gradient all-reduce of its training forward #4 at "
        "project/ddp_uneven_inputs.py:19")
    assert cause["where"] == str(base / "project" / "ddp_uneven_inputs.py") + ":19"


def test_a_healthy_script_gets_no_patch(distdoctor, tmp_path):
    done, report, script = fix_run(distdoctor, tmp_path, "averaged_gradients.py", 3)
    assert done.returncode == 0 and report["fixes"] == [], done.stdout
    assert "distdoctor run --fix: nothing to fix" in done.stdout
    assert script.read_text() == (EXAMPLES / "averaged_gradients.py").read_text()


def test_an_edit_that_does_not_cure_the_run_is_never_offered_nor_applied(
        distdoctor, tmp_path, monkeypatch):
    """A remedy forced to divide by 2 at world size 3: the patched copy still sums 1.5x,
    so the patch is refused, and --apply leaves the script as it was."""
    def halve(source: str, line: int, also: tuple[int, ...]) -> str | None:
        edited = average_the_sum(source, line, also)
        return edited.replace("dist.get_world_size()", "2") if edited else None

    monkeypatch.setitem(remedies.REMEDIES, "sum-without-mean", halve)
    patch = tmp_path / "fix.patch"
    done, report, script = fix_run(distdoctor, tmp_path, "summed_gradients.py", 3, "--apply",
                                   "--patch", str(patch))
    [fix] = report["fixes"]
    assert (fix["verified"], fix["diff"], fix["applied"]) == (False, "", None), done.stdout
    assert fix["rerun"] == "FAILED: sum-without-mean (ranks 0-2)"
    assert "did not verify" in done.stdout and "+++ b/" not in done.stdout
    assert not patch.exists() and not script.with_name("summed_gradients.py.orig").exists()
    assert script.read_text() == (EXAMPLES / "summed_gradients.py").read_text()


def test_a_cause_no_edit_can_cure_is_said_in_one_line(distdoctor, tmp_path):
    done, report, _ = fix_run(distdoctor, tmp_path, "rank_spins.py", 2, "--deadline", "2")
    assert report["cause"]["kind"] == "busy-rank" and report["fixes"] == [], done.stdout
    assert "distdoctor run --fix: busy-rank: no mechanical edit is safe (a rank busy in its " \
        "own code" in done.stdout


def test_a_cause_of_another_shape_than_its_remedy_knows_gets_no_patch(distdoctor, tmp_path):
    """failed-sync from gradients paired in a per-rank order: no Work to wait for, so the
    waiting remedy makes no edit and says so; the script is untouched."""
    done, report, script = fix_run(distdoctor, tmp_path, "grads_paired_per_rank_order.py", 2,
                                   "--apply")
    assert report["cause"]["kind"] == "failed-sync" and report["fixes"] == [], done.stdout
    assert "distdoctor run --fix: failed-sync: the code at grads_paired_per_rank_order.py:" \
        in done.stdout and "is not a shape its remedy knows" in done.stdout
    assert script.read_text() == (EXAMPLES / "grads_paired_per_rank_order.py").read_text()


def test_a_patch_path_that_cannot_be_written_is_one_line_and_exit_2(distdoctor, tmp_path):
    """A missing folder is refused before any rank starts; a path that cannot be written
    (a folder) once the patch verified: the report still written, the script untouched."""
    missing = distdoctor("run", "--fix", "--patch", str(tmp_path / "no" / "fix.patch"),
                         "summed_gradients.py")
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.strip().splitlines() == [
        f"distdoctor run: error: --patch {tmp_path / 'no' / 'fix.patch'}: no such folder "
        "to write it in"]
    done, report, script = fix_run(distdoctor, tmp_path, "summed_gradients.py", 3, "--apply",
                                   "--patch", str(tmp_path))
    assert done.returncode == 2 and report["fixes"][0]["verified"], done.stdout
    assert done.stderr.strip().splitlines()[-1] == (
        f"distdoctor run: error: the verified patch was not written: Is a directory: {tmp_path}")
    assert "Traceback" not in done.stderr
    assert script.read_text() == (EXAMPLES / "summed_gradients.py").read_text()
