"""The command line: the train baseline, its JSON record, and one-line usage errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.jsoncodec import to_json
from harness.models import load_report


def test_train_prints_the_table_and_writes_a_passing_record(tmp_path, capsys):
    out = tmp_path / "r.json"
    code = main(["train", "--strategy", "torch-ddp", "--world-size", "4", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert "loss per rank" in printed and "PASS" in printed
    assert len([line for line in printed.splitlines() if line[:4].strip().isdigit()]) == 7
    report = load_report(out)
    assert report.verdict.passed and report.record.spec.world_size == 4
    assert to_json(report) == json.loads(out.read_text())


def test_no_write_leaves_no_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--world-size", "2", "--no-write"]) == 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [
    ["train", "--world-size", "0"],
    ["train", "--strategy", "nope"],
    ["train", "--num-steps", "-1"],
    ["train", "--batch-size", "8", "--micro-batches", "3"],
    ["train", "--world-size", "4", "--num-samples", "16"],
    ["train", "--deadline", "0"],
    ["train", "--out", "x.json", "--no-write"],
    ["train", "--backend", "nccl", "--no-write"],  # no GPU on this machine
    [],
    ["diagnose", "--strategy", "ddp", "--fault", "nope"],
    ["diagnose", "--strategy", "ddp", "--fault", "unused-params", "--variant", "nope"],
    ["diagnose", "--fault", "sum-without-mean"],
    ["demo"],
    ["demo", "--all", "--variant", "sum"],
    ["demo", "nope"],
])
def test_bad_arguments_get_one_line_and_exit_code_2(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    assert code == 2
    assert len(captured.err.strip().splitlines()) == 1 and "error:" in captured.err
    assert "Traceback" not in captured.err + captured.out


def test_the_module_entry_point_runs_the_same_command(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    ok = subprocess.run([sys.executable, "-m", "harness", "train", "--world-size", "2",
                         "--no-write"], capture_output=True, text=True, env=env, timeout=120,
                        cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "PASS" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "harness", "train", "--world-size", "0"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert list(Path(tmp_path).iterdir()) == []


def test_diagnose_prints_before_and_after_and_writes_the_report(tmp_path, capsys):
    out = tmp_path / "d.json"
    code = main(["diagnose", "--strategy", "ddp", "--fault", "sum-without-mean",
                 "--world-size", "4", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert "4.00x the mean" in printed and "verdict: FIXED" in printed
    report = load_report(out)
    assert report.fault == "sum-without-mean:sum" and report.verdict.outcome == "fixed"
    assert report.fixed_record.spec.knobs.average_gradients is True


@pytest.mark.parametrize("argv, code, verdict", [
    (["--strategy", "torch-ddp", "--fault", "divergent-init"], 0, "verdict: MASKED"),
    (["--strategy", "ddp", "--fault", "unused-params", "--world-size", "1"], 1,
     "verdict: NOT REPRODUCED"),
])
def test_diagnose_exit_codes_follow_the_verdict(argv, code, verdict, capsys):
    assert main(["diagnose", *argv]) == code
    assert verdict in capsys.readouterr().out


def test_demo_of_one_fault_tells_the_lesson_in_order(capsys):
    assert main(["demo", "divergent-init"]) == 0
    printed = capsys.readouterr().out
    sections = ["What goes wrong:", "What we measured:", "Why:", "The fix:", "After the fix:",
                "On torch-ddp: MASKED"]
    positions = [printed.index(section) for section in sections]
    assert positions == sorted(positions)
    assert "spread 0.677 at step 0" in printed


def test_demo_all_sweeps_every_fault_and_ends_with_the_summary(capsys):
    assert main(["demo", "--all"]) == 0
    printed = capsys.readouterr().out
    rows = [line for line in printed.splitlines() if line.split()[:1] and
            line.split()[0] in {"divergent-init", "shared-shuffle-seed", "unused-params",
                                "sum-without-mean", "allreduce-every-microbatch"}]
    assert len(rows) == 14 and all(row.split()[-1] in ("fixed", "masked") for row in rows)
    assert "14 of 14 detected and fixed" in printed


def test_faults_lists_the_catalogue(capsys):
    assert main(["faults"]) == 0
    printed = capsys.readouterr().out
    for fault_id in ("divergent-init", "shared-shuffle-seed", "unused-params",
                     "sum-without-mean", "allreduce-every-microbatch"):
        assert f"\n{fault_id}: " in printed
