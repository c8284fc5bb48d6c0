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
