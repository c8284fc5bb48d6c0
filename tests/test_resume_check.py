"""``distdoctor resume-check`` on real ranks: each resume bug of examples/resume named with
its step, ranks and lines; the healthy resume OK; what cannot be checked is one line and
exit 2. Each check is three runs of the script, in the background lanes."""

from __future__ import annotations

import html
import json
import shutil
import sys
from pathlib import Path

import pytest
from lanes import Job, Step

pytestmark = pytest.mark.tier("e2e")

RESUME = Path(__file__).parent.parent / "examples" / "resume"
CHECKS = ["resume_every_state.py", "resume_rng_from_rank0.py",
          "resume_scheduler_forgotten.py", "resume_epoch_started_over.py",
          "resume_dcp_rng_replicated.py", "resume_optimizer_on_one_rank.py",
          "resume_sampler_epoch_lost.py", "resume_not_deterministic.py",
          "resume_not_deterministic_momentum_lost.py"]


def lane_jobs(root: Path) -> list[Job]:
    jobs = []
    for number, example in enumerate(CHECKS):
        base = root / str(number)
        base.mkdir(parents=True)
        argv = (sys.executable, "-m", "distdoctor", "resume-check", "--report",
                str(base / "report.json"), "--html", str(base / "report.html"),
                str(RESUME / example))
        jobs.append(Job(f"resume-check {example}", (Step("check", argv, str(base),
                                                         timeout=300.0),)))
    base = root / "three"  # at 3 ranks DDP's first iteration after a restart rounds otherwise
    base.mkdir(parents=True)
    jobs.append(Job("resume-check at 3 ranks", (Step("check", (
        sys.executable, "-m", "distdoctor", "resume-check", "--nproc-per-node", "3",
        "--report", str(base / "report.json"), str(RESUME / "resume_every_state.py")),
        str(base), timeout=300.0),)))
    base = root / "steps"  # --steps: the runs after the checkpoint stopped one step on
    base.mkdir(parents=True)
    jobs.append(Job("resume-check --steps 1", (Step("check", (
        sys.executable, "-m", "distdoctor", "resume-check", "--steps", "1", "--report",
        str(base / "report.json"), str(RESUME / "resume_scheduler_forgotten.py")), str(base),
        timeout=300.0),)))
    base = root / "torchrun"  # the command form: torchrun starts the ranks, three times
    base.mkdir(parents=True)
    shutil.copy(RESUME / "resume_rng_from_rank0.py", base / "train.py")
    argv = (sys.executable, "-m", "distdoctor", "resume-check", "--report",
            str(base / "report.json"), "--", sys.executable, "-m", "torch.distributed.run",
            "--standalone", "--nproc-per-node", "2", "train.py")
    jobs.append(Job("resume-check -- torchrun", (Step("check", argv, str(base),
                                                      timeout=300.0),)))
    return jobs


def checked(lanes, example: str):
    done = lanes.result(f"resume-check {example}")["check"]
    base = Path(lanes.job(f"resume-check {example}").steps[0].cwd)
    report = base / "report.json"
    return done, json.loads(report.read_text()) if report.exists() else None, base


def line(example: str, marker: str) -> str:
    text = (RESUME / example).read_text().splitlines()
    return f"{RESUME / example}:{next(i for i, t in enumerate(text, 1) if marker in t)}"


@pytest.mark.timeout(900)  # the first test may wait for its job
def test_a_resume_that_restores_every_state_trains_like_one_that_never_stopped(lanes):
    done, report, base = checked(lanes, "resume_every_state.py")
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert (report["status"], report["checkpoint_step"], report["compared_steps"]) == \
        ("ok", 2, [3, 8])
    assert "1 of 3" in done.stdout and "3 of 3" in done.stdout
    assert sorted(p.name for p in base.iterdir()) == ["report.html", "report.json"]  # only


@pytest.mark.timeout(900)
@pytest.mark.parametrize("example, kind, ranks, step, said", [
    ("resume_rng_from_rank0.py", "rng-state-not-restored", [1], 3,
     [f"saved by rank 0 only at {line('resume_rng_from_rank0.py', 'torch.save(')}",
      f"its state set by every rank at {line('resume_rng_from_rank0.py', 'set_rng_state')}"]),
    ("resume_scheduler_forgotten.py", "scheduler-not-restored", [0, 1], 4,
     ["lr 0.05 uninterrupted, 0.1 resumed", "the scheduler starts over"]),
    ("resume_epoch_started_over.py", "sampler-not-restored", [0, 1], 2,
     ["the data loader's position is not restored"]),
    ("resume_optimizer_on_one_rank.py", "optimizer-state-not-restored", [1], 3,
     ["the optimiser's state (momentum, Adam's moments) is not restored on these ranks"]),
    ("resume_not_deterministic_momentum_lost.py", "optimizer-state-not-restored", [0, 1], 3,
     ["(empty after the resume, or of another size: not the same state)"]),
    ("resume_sampler_epoch_lost.py", "sampler-not-restored", [0, 1], 3,
     ["the sampler's epoch at step 3 after the resume differs from the uninterrupted run's "
      "(1 uninterrupted, 0 resumed)"]),
])
def test_each_resume_bug_is_named_with_its_step_ranks_and_lines(lanes, example, kind, ranks,
                                                                step, said):
    done, report, _ = checked(lanes, example)
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert (report["kind"], report["ranks"], report["measured"]["step"]) == \
        (kind, ranks, step), report["summary"]
    for text in said:
        assert text in report["summary"]
    assert f"distdoctor resume-check: FAILED: {kind}: {report['summary']}" in done.stdout
    page = (Path(lanes.job(f"resume-check {example}").steps[0].cwd) / "report.html").read_text()
    assert f"FAILED: {kind}" in page and html.escape(report["summary"]) in page


@pytest.mark.timeout(900)
def test_a_healthy_resume_at_three_ranks_is_ok_through_the_rounding_ddp_brings(lanes):
    """Restarted, DDP buckets its first iteration's gradients in another order, and three
    ranks' sums round otherwise (about 1e-8 relative): bitwise, that read as a lost state."""
    done = lanes.result("resume-check at 3 ranks")["check"]
    base = Path(lanes.job("resume-check at 3 ranks").steps[0].cwd)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    report = json.loads((base / "report.json").read_text())
    assert (report["status"], report["checkpoint_step"], report["compared_steps"]) == \
        ("ok", 2, [3, 8])
    assert all(0 <= gap <= 1e-5 for gap in report["measured"]["rounding"].values())


@pytest.mark.timeout(900)
def test_a_run_that_is_not_deterministic_resumes_ok_within_its_stated_tolerance(lanes):
    """Its micro-batches are summed in an order seeded from the OS: two runs from the start
    differ (by about 1e-7 relative), so the states with values are compared within 1e-3,
    and it resumes like one that never stopped."""
    done, report, _ = checked(lanes, "resume_not_deterministic.py")
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert (report["status"], report["compared_steps"]) == ("ok", [3, 8])
    assert 0 < report["measured"]["noise"] < 1e-5  # float noise, not a lost state
    assert report["measured"]["tolerance"] == 1e-3
    assert "the script is not deterministic" in report["summary"]


@pytest.mark.timeout(900)
def test_a_distributed_checkpoint_that_keeps_one_ranks_rng_state_is_named(lanes):
    """DCP writes one copy of a tensor every rank saves under one key: which rank's is
    DCP's choice, so the test asks for one rank, not which."""
    done, report, _ = checked(lanes, "resume_dcp_rng_replicated.py")
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert (report["kind"], len(report["ranks"]), report["measured"]["which"]) == \
        ("rng-state-not-restored", 1, ["torch"]), report["summary"]
    assert f"loaded by every rank at {line('resume_dcp_rng_replicated.py', 'dcp.load(')}" \
        in report["summary"]


@pytest.mark.timeout(900)
def test_steps_bound_the_runs_after_the_checkpoint(lanes):
    """--steps 1: runs 2 and 3 stop one step past the checkpoint (step 3), before the
    forgotten schedule shows (step 4): OK, and says which step it compared."""
    done = lanes.result("resume-check --steps 1")["check"]
    base = Path(lanes.job("resume-check --steps 1").steps[0].cwd)
    report = json.loads((base / "report.json").read_text())
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert report["compared_steps"] == [3, 3] and "bitwise at step 3 on" in report["summary"]
    assert "once through to step 3" in done.stdout


@pytest.mark.timeout(900)
def test_a_command_is_checked_the_same_way(lanes):
    """resume-check -- torchrun ...: the command run three times from fresh folders (the
    script reached through the folder's link to it), its group's ranks compared."""
    done = lanes.result("resume-check -- torchrun")["check"]
    base = Path(lanes.job("resume-check -- torchrun").steps[0].cwd)
    report = json.loads((base / "report.json").read_text())
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert (report["kind"], report["ranks"], report["measured"]["step"]) == \
        ("rng-state-not-restored", [1], 3)
    assert sorted(p.name for p in base.iterdir()) == ["report.json", "train.py"]


def test_a_checkpoint_outside_the_runs_folder_or_too_few_cannot_be_checked(distdoctor,
                                                                           tmp_path):
    # the all-reduce: without a collective, a rank may leave while its peer is still
    # connecting in init_process_group, and gloo fails the peer (torch makes no barrier
    # there): under the suite's load, 2 runs in about 5 (test_startup.py tells it)
    script = tmp_path / "train.py"
    script.write_text(
        "import sys\nimport torch\nimport torch.distributed as dist\n"
        "dist.init_process_group('gloo')\nw = torch.nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(w.parameters(), lr=0.1)\n"
        "w(torch.ones(1, 2)).sum().backward()\ndist.all_reduce(w.weight.grad); opt.step()\n"
        "torch.save(w.state_dict(), sys.argv[1])  # SAVE\ndist.destroy_process_group()\n")
    absolute = distdoctor("resume-check", str(script), str(tmp_path / "last.pt"))
    assert absolute.returncode == 2, absolute.stdout + absolute.stderr
    assert absolute.stderr.strip().splitlines()[-1] == (
        f"distdoctor resume-check: error: the checkpoint at {script}:9 is written to "
        f"{tmp_path / 'last.pt'}, outside the run's own folder (an absolute path, or a "
        f"folder of yours): the three runs would share it. Give the script a relative "
        f"checkpoint path in a folder it creates")
    too_few = distdoctor("resume-check", "--at", "2", str(script), "last.pt")
    assert too_few.returncode == 2 and "Traceback" not in too_few.stderr
    assert too_few.stderr.strip().splitlines()[-1] == (
        "distdoctor resume-check: error: train.py wrote fewer than 2 checkpoints "
        "(torch.save, torch.distributed.checkpoint.save): nothing to resume from at --at 2")
    last = distdoctor("resume-check", str(script), "last.pt")
    assert last.returncode == 2 and last.stderr.strip().splitlines()[-1] == (
        "distdoctor resume-check: error: checkpoint #1 of train.py is written after its "
        "last step (1): nothing after it to compare; give a smaller --at")
    assert not (Path.cwd() / "last.pt").exists()  # written in the runs' own folders
