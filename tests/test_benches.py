"""Benchmarks that cannot rot: every script in ``bench/`` runs here in its smoke mode
(seconds, small sizes), as a user would start it, and must end well with its result line.
The numbers are not judged here (speed is judged in the benches' own full runs, side by
side); only that each still runs against today's code."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from lanes import Job, Step, StepResult

pytestmark = pytest.mark.tier("e2e")

ROOT = Path(__file__).resolve().parent.parent
# script -> the last line its smoke run prints: its result, with numbers where measured
SMOKE = {
    "collectives.py": r"^ *2 +10000 +[\d.]+ +[\d.]+ +[\d.]+x$",  # N, T, ours, gloo, ratio
    "launch.py": r"^ *2 +\d+ ms +[\d.]+ ms +[\d.]+ ms +\d+x +[\d.]+x$",
    "matrix.py": r"^forked group per run: +[\d.]+ s +\(\d+ runs, 2/2 pass\)",
    "pipeline.py": r"^pipe-gpipe +S=2 M=8 +measured +[\d.]+% +simulated gpipe",
    "zero.py": r"^fsdp2-grad-op +\d",
    "hang_time.py": r"^ +proof, --deadline 300 +[\d.]+ s +\(deadlock\)$",
    "pytest_plugin.py": r"^per test, the plugin is \d+x faster",
    "soak.py": r"^ +diagnose .*: 1 of 1 passed$",
    "run_overhead.py": r"^evidence on a 1.05M-parameter DDP step, 2 ranks, 6 steps: [\d.]+ CPU",
    # ranks, MB written, s; ours: s, MB, verdict; fr_trace's; the ratio
    "flight_recorder.py": r"^ +32 +\d+ MB +[\d.]+ s +[\d.]+ s +\d+ MB +collective-mismatch "
                          r"\(rank 21\) right .* [\d.]+x$",
}
HELPERS = {"ddp_1m.py", "evidence_blocks.py", "phases_blocks.py",  # run by run_overhead.py
           "frdumps.py"}  # the dumps flight_recorder.py reads (and the tests)


def test_every_bench_has_a_smoke_run():
    scripts = {path.name for path in (ROOT / "bench").glob("*.py")}
    assert scripts == set(SMOKE) | HELPERS


# the longest first, so the two lanes end together (seconds here, one at a time)
LONGEST_FIRST = ("run_overhead.py", "pytest_plugin.py", "hang_time.py", "pipeline.py",
                 "launch.py", "matrix.py", "zero.py", "soak.py", "flight_recorder.py",
                 "collectives.py")


def lane_jobs(root: Path) -> list[Job]:
    """Every bench's smoke run, each in a fresh interpreter as a user starts it, as
    background jobs (tests/lanes.py): much of a run is spent importing torch and forming
    groups, which overlaps the in-process tests. The numbers are not judged, so sharing
    the machine changes no verdict."""
    return [Job(f"bench {script}", (Step("smoke", (sys.executable, str(ROOT / "bench" / script),
                                                     "--smoke"), str(ROOT), timeout=280),))
            for script in LONGEST_FIRST]


@pytest.fixture(scope="module")
def smoke_runs(lanes) -> dict[str, StepResult]:
    return {script: lanes.result(f"bench {script}")["smoke"] for script in LONGEST_FIRST}


def test_every_bench_is_in_the_smoke_order():
    assert sorted(LONGEST_FIRST) == sorted(SMOKE)


@pytest.mark.timeout(600)  # the first test pays for every run (module fixture)
@pytest.mark.parametrize("script", sorted(SMOKE))
def test_the_bench_runs_in_its_smoke_mode(script, smoke_runs):
    done = smoke_runs[script]
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert lines and re.search(SMOKE[script], lines[-1]), done.stdout[-2000:]
