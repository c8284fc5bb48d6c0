"""``distdoctor run --fix`` through the real command: a patch offered only once the patched
copy, re-run on real ranks, no longer reports what it cures; healthy scripts get none; a
wrong edit is never offered and never applied; a cause no edit can cure is said so."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("example, ranks, cures, changed", [
    ("summed_gradients.py", 3, "gradient-not-averaged",
     ["+        p.grad /= dist.get_world_size()"]),
    ("epoch_not_set.py", 2, "repeated-epoch-order", ["+    sampler.set_epoch(epoch)"]),
    ("ddp_unused_params.py", 2, "unused-parameters",
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
    ("accumulate_without_no_sync.py", 2, "sync-every-microbatch",
     ["+import contextlib", "-        loss = model(batch).pow(2).mean() / 4  # FORWARD",
      "-        loss.backward()",
      "+        with model.no_sync() if micro < 3 else contextlib.nullcontext():",
      "+            loss = model(batch).pow(2).mean() / 4  # FORWARD",
      "+            loss.backward()"]),
    ("own_seed_no_broadcast.py", 3, "divergent-parameters",
     ["+for tensor in model.state_dict().values():", "+    dist.broadcast(tensor, src=0)"]),
])
def test_each_mechanical_cause_gets_a_patch_that_verifies_and_applies(
        distdoctor, tmp_path, example, ranks, cures, changed):
    patch = tmp_path / "fix.patch"
    done, report, script = fix_run(distdoctor, tmp_path, example, ranks, "--apply",
                                   "--patch", str(patch), "--html",
                                   str(tmp_path / "report.html"))
    assert done.returncode == 1, done.stdout  # the run it diagnosed had the bug
    [fix] = report["fixes"]
    assert (fix["cures"], fix["verified"], fix["rerun"]) == ([cures], True, "OK"), done.stdout
    assert [line for line in fix["diff"].splitlines()  # the lines it changes, no other
            if line[:1] in "+-" and line[:3] not in ("+++", "---")] == changed
    assert patch.read_text() == fix["diff"] and fix["diff"] in done.stdout
    original = (EXAMPLES / example).read_text()
    assert script.with_name(example + ".orig").read_text() == original
    kept = [line for line in script.read_text().splitlines() if f"+{line}" not in changed]
    assert kept == [line for line in original.splitlines() if f"-{line}" not in changed]
    assert fix["applied"] == str(script.with_name(example + ".orig"))
    page = (tmp_path / "report.html").read_text()  # the patch beside the cause it cures
    assert page.index(f'<span class="kind">{cures}</span>') < page.index('<pre class="diff">')
    assert "patch verified: the patched copy reports OK" in page


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

    monkeypatch.setitem(remedies.REMEDIES, "gradient-not-averaged", halve)
    patch = tmp_path / "fix.patch"
    done, report, script = fix_run(distdoctor, tmp_path, "summed_gradients.py", 3, "--apply",
                                   "--patch", str(patch))
    [fix] = report["fixes"]
    assert (fix["verified"], fix["diff"], fix["applied"]) == (False, "", None), done.stdout
    assert fix["rerun"] == "FAILED: gradient-not-averaged (ranks 0-2)"
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
