"""Benchmarks that cannot rot: every script in ``bench/`` runs here in its smoke mode
(seconds, small sizes), as a user would start it, and must end well with its result line.
The numbers are not judged here (speed is judged in the benches' own full runs, side by
side); only that each still runs against today's code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# script -> a piece of the last line its smoke run prints
SMOKE = {
    "collectives.py": "x",
    "launch.py": "x",
    "matrix.py": "forked group per run",
    "pipeline.py": "measured",
    "zero.py": "fsdp2-grad-op",
    "hang_time.py": "proof, --deadline 300",
    "pytest_plugin.py": "per test, the plugin is",
    "soak.py": "1 of 1 passed",
    "run_overhead.py": "evidence on a 1.05M-parameter DDP step",
}
HELPERS = {"ddp_1m.py", "evidence_blocks.py"}  # run by run_overhead.py, not on their own


def test_every_bench_has_a_smoke_run():
    scripts = {path.name for path in (ROOT / "bench").glob("*.py")}
    assert scripts == set(SMOKE) | HELPERS


@pytest.mark.timeout(300)
@pytest.mark.parametrize("script", sorted(SMOKE))
def test_the_bench_runs_in_its_smoke_mode(script):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--smoke"],
                          cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert lines and SMOKE[script] in lines[-1], done.stdout[-2000:]
