"""Healthy code that nobody here wrote for distdoctor reports OK: a false alarm costs as much
as a miss. ``examples/healthy/`` holds scripts in the shapes people use (how a rank ends,
loaders with workers, checkpoints, object collectives, rank-dependent logging, evaluation
on one rank, DDP's options, ZeRO, FSDP2, two process groups; ``selflaunch/``, scripts
that start their own ranks, run through ``run -- COMMAND`` in test_any_launcher); each
runs through the real command, some under a real torchrun with ``analyze`` afterwards,
and the data-parallel steps through ``assert_trains_like_one_process``. A bug added to a
few of them is still named, under the right headline. Add a script here for every false
alarm found."""

from __future__ import annotations

import functools
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from lanes import Job, Step
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from distdoctor.testing import assert_trains_like_one_process

pytestmark = pytest.mark.tier("e2e")

HEALTHY = Path(__file__).resolve().parent.parent / "examples" / "healthy"
# (script, arguments, ranks)
CORPUS = [
    ("exit_os_exit.py", (), 2),
    ("exit_destroy_then_os_exit.py", (), 2),
    ("exit_sys_exit.py", (), 2),
    ("exception_caught.py", (), 2),
    ("daemon_thread.py", (), 2),
    ("dataloader_workers.py", (), 2),
    ("dataloader_workers.py", ("persistent",), 2),
    ("checkpoint_save_load.py", (), 2),
    ("uneven_objects.py", (), 3),
    ("rank_logging.py", (), 2),
    ("eval_on_rank0_module.py", (), 2),
    *[("ddp_variants.py", (variant,), 2) for variant in (
        "clip", "autocast", "checkpoint", "static-graph", "bucket-view", "comm-hook",
        "find-unused")],
    ("zero_redundancy.py", (), 2),
    ("fully_shard.py", (), 2),
    ("fsdp_checkpoint_every_rank.py", (), 2),  # fsdp_checkpoint_on_rank0.py, done right
    ("batchnorm_buffers.py", (), 2),  # batchnorm_buffers_not_broadcast.py, done right
    ("two_groups_mesh.py", (), 4),
    # resume_optimizer_on_rank0.py, clip_on_rank0.py, scheduler_on_rank_0.py, done right
    ("resume_clip_schedule.py", (), 2),
    ("hand_averaged_clip.py", (), 3),  # lr_from_local_batch.py's hand-written sync, right
    ("independent_models_own_lr.py", (), 4),  # no replicas: each rank its own settings
    # no replicas either: the gradients agree at step 1 by the same data, not by a sync
    ("lr_sweep_same_data.py", (), 3),
    # each rank its own shard of the files, no DistributedSampler: ids alike, samples not
    ("per_rank_shards.py", (), 2),
    ("ordered_epochs.py", (), 2),  # shuffle=False on purpose: each epoch in one order
    # loader_per_epoch.py told the epoch, zipped with a second loader over the same data
    ("fresh_loader_each_epoch.py", (), 2),
    # accumulate_sync_on_first.py's micro-batches, all in no_sync(), then synced by hand
    ("accumulate_then_sync_by_hand.py", (), 2),
    ("batch_passed_over.py", (), 2),  # one step retried: no micro-batches accumulated
    # a clear between a step's two forwards, the weights moved between them (SAM); and
    # the DDP's state dict as torch made it (a tracer once added a key to it)
    ("sharpness_aware.py", (), 2),
    ("ddp_steps.py", (), 4),  # 64 steps: long enough for the straggler check to judge
    # replicas within subgroups: data x tensor parallel by hand, DDP per replicate group
    ("dp_tp_subgroups.py", (), 4),
    ("replicate_groups.py", (), 4),
    ("slow_start_one_rank.py", (), 2),  # start-up judged apart from the job's deadline
    ("init_methods.py", ("tcp",), 2),  # the start-up read as it is: nothing wrong in it
    ("init_methods.py", ("file",), 2),
]


def test_every_healthy_script_is_in_the_corpus():
    scripts = {p.name for p in HEALTHY.glob("*.py") if not p.name.startswith("_")}
    assert scripts == {script for script, _, _ in CORPUS}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("script, args, ranks", CORPUS,
                         ids=[" ".join((s, *a)) for s, a, _ in CORPUS])
def test_healthy_code_reports_ok(distdoctor, monkeypatch, script, args, ranks):
    monkeypatch.chdir(HEALTHY)
    done = distdoctor("run", "--nproc-per-node", str(ranks), script, *args)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert f"distdoctor run: OK: all {ranks} ranks of {script} finished" in done.stdout


# Under torchrun a rank's end reaches distdoctor only through its trace, so the torchrun
# path is run for every shape whose end or process tree differs: the endings, and the
# scripts that start processes (DataLoader workers leave by os._exit too, and inherit the
# rank's trace) or threads of their own. The other shapes return as under distdoctor run.
TORCHRUN = [("exit_os_exit.py", ()), ("exit_destroy_then_os_exit.py", ()),
            ("exit_sys_exit.py", ()), ("daemon_thread.py", ()), ("dataloader_workers.py", ()),
            ("dataloader_workers.py", ("persistent",)), ("checkpoint_save_load.py", ()),
            ("init_methods.py", ("tcp",))]


def lane_jobs(root: Path) -> list[Job]:
    """Every TORCHRUN shape under a real torchrun with the in-rank bootstrap, in a copy of
    the corpus of its own, as background jobs (tests/lanes.py): each spends most of its
    seconds starting interpreters that import torch. The verdicts do not depend on timing
    (each rank's deadline is 60 s)."""
    jobs = []
    for number, (script, args) in enumerate(TORCHRUN):
        base = root / str(number)  # short: TMPDIR is in it (see conftest.py)
        shutil.copytree(HEALTHY, base / "project")
        command = (sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", "2", "-m", "distdoctor.userjob", "--trace-dir",
                   str(base / "traces"), script, *args)
        jobs.append(Job(_job_name(script, args), (Step(
            "torchrun", command, str(base / "project"), {"TMPDIR": str(base)}),)))
    return jobs


def _job_name(script: str, args: tuple[str, ...]) -> str:
    return " ".join(("healthy under torchrun", script, *args))


@pytest.fixture(scope="module")
def torchrun_runs(lanes):
    """(torchrun's answer, the trace folder) of each shape."""
    runs = {}
    for script, args in TORCHRUN:
        name = _job_name(script, args)
        project = Path(lanes.job(name).steps[0].cwd)
        runs[(script, args)] = (lanes.result(name)["torchrun"], project.parent / "traces")
    return runs


@pytest.mark.timeout(900)  # the first test waits for every run (module fixture)
@pytest.mark.parametrize("script, args", TORCHRUN, ids=[" ".join((s, *a)) for s, a in TORCHRUN])
def test_healthy_code_under_torchrun_is_analysed_ok(distdoctor, torchrun_runs, script, args):
    """Under a real torchrun with the in-rank bootstrap, then ``analyze`` on the traces.
    Each rank's trace holds one exit, its own: a rank that left by os._exit(0) wrote it
    first, and no forked worker wrote one for it."""
    done, traces = torchrun_runs[(script, args)]
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        lines = (traces / f"rank-{rank}.jsonl").read_text().splitlines()
        assert sum(line.startswith('{"ev":"exit"') for line in lines) == 1, rank
    analysed = distdoctor("analyze", str(traces))
    assert analysed.returncode == 0, analysed.stdout
    assert analysed.stdout.startswith("distdoctor analyze: OK: all 2 ranks")


# -- a bug added to the healthy shapes is still named, under the right headline --------

def test_a_summing_bug_before_os_exit_is_named_not_called_a_crash(distdoctor, monkeypatch,
                                                                   tmp_path):
    script = (HEALTHY / "exit_sys_exit.py").read_text().replace(
        "            p.grad /= dist.get_world_size()\n", "").replace(
        "    return 0", "    os._exit(0)").replace("import sys", "import os\nimport sys")
    _write(tmp_path, "summing_os_exit.py", script)
    monkeypatch.chdir(tmp_path)
    done = distdoctor("run", "--nproc-per-node", "2", "summing_os_exit.py")
    assert done.returncode == 1
    assert "distdoctor run: FAILED: sum-without-mean (ranks 0, 1)" in done.stdout
    assert "rank-crashed" not in done.stdout


def test_a_rank_that_leaves_by_os_exit_while_its_peer_waits_exited_early(distdoctor,
                                                                        monkeypatch, tmp_path):
    _write(tmp_path, "leaves.py", "import os\nimport torch\nimport torch.distributed as dist\n"
           "dist.init_process_group('gloo')\nt = torch.ones(2)\ndist.all_reduce(t)\n"
           "if dist.get_rank() == 0:\n    os._exit(0)\ndist.all_reduce(t)  # LEFT ALONE\n")
    monkeypatch.chdir(tmp_path)
    done = distdoctor("run", "--nproc-per-node", "2", "--deadline", "20", "leaves.py")
    assert done.returncode == 1
    assert "distdoctor run: FAILED: rank-exited-early (rank 0)" in done.stdout


@pytest.mark.parametrize("leave, said", [("sys.exit(3)", "exited with code 3"),
                                         ("sys.exit('no data for this rank')",
                                          "no data for this rank")])
def test_a_non_zero_exit_is_a_crash_with_what_it_said(distdoctor, monkeypatch, tmp_path,
                                                      leave, said):
    _write(tmp_path, "exits.py", "import sys\nimport torch.distributed as dist\n"
           "dist.init_process_group('gloo')\ndist.barrier()\n"
           f"if dist.get_rank() == 1:\n    {leave}\n")
    monkeypatch.chdir(tmp_path)
    done = distdoctor("run", "--nproc-per-node", "2", "exits.py")
    assert done.returncode == 1
    assert "distdoctor run: FAILED: rank-crashed (rank 1)" in done.stdout
    assert said in done.stdout


def test_a_clip_on_one_rank_of_a_replicate_group_is_named_within_its_group(
        distdoctor, monkeypatch, tmp_path):
    """replicate_groups.py with rank 2 alone clipping: the replicas {0, 2} of one DDP are
    judged together (the other group holds another model, and is never compared)."""
    script = (HEALTHY / "replicate_groups.py").read_text().replace(
        "    optimizer.step()\n", "    if rank == 2:\n        torch.nn.utils.clip_grad_norm_("
        "model.parameters(), max_norm=0.01)  # BUG\n    optimizer.step()\n")
    _write(tmp_path, "clip_in_group.py", script)
    monkeypatch.chdir(tmp_path)
    done = distdoctor("run", "--nproc-per-node", "4", "--report", "r.json", "clip_in_group.py")
    assert done.returncode == 1, done.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert [(c["kind"], c["ranks"]) for c in report["findings"]] == [
        ("rank-dependent-update", [2]), ("divergent-parameters", [2])]
    assert "DistributedDataParallel over ranks 0, 2" in done.stdout


def _write(folder: Path, name: str, text: str) -> None:
    shutil.copy(HEALTHY / "_common.py", folder / "_common.py")
    (folder / name).write_text(text)


# -- the same data-parallel steps through assert_trains_like_one_process ---------------

def _build(options: dict):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    wrapped = DistributedDataParallel(net, **options) if dist.is_initialized() else net
    return wrapped, torch.optim.SGD(wrapped.parameters(), lr=0.1)


def _step(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
    optimizer.step()


_data = torch.Generator().manual_seed(3)
BATCHES = [(torch.randn(8, 4, generator=_data), torch.randn(8, 1, generator=_data))
           for _ in range(3)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("options", [{}, {"static_graph": True},
                                     {"gradient_as_bucket_view": True},
                                     {"find_unused_parameters": True}],
                         ids=["plain", "static-graph", "bucket-view", "find-unused"])
def test_ddp_options_train_like_one_process(options):
    assert_trains_like_one_process(functools.partial(_build, options), _step, BATCHES,
                                   world_size=2)
