"""The background lanes (tests/lanes.py) the suite's heaviest jobs run in: a step past its
timeout is stopped with every process it started, even those in sessions of their own
(as torchrun starts its ranks); a step failing with the retry text runs again, counted;
closing stops what still runs and leaves nothing behind."""

from __future__ import annotations

import sys

import lanes
import proctable
import pytest

pytestmark = pytest.mark.tier("e2e")

# a step that starts a grandchild in a session of its own, which holds the step's stdout
# and would outlive a kill of the step's own process group; it prints its pid first
ORPHANING = ("import os, subprocess, sys, time\n"
             "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
             " start_new_session=True)\n"
             "print(child.pid, flush=True)\n"
             "time.sleep(60)\n")
FAILING = "import sys\nsys.stderr.write('torch teardown abort\\n')\nsys.exit(3)\n"


def test_a_step_past_its_timeout_is_stopped_with_every_process_it_started(tmp_path):
    (tmp_path / "results").mkdir()
    started = lanes.Lanes([lanes.Job("orphaning", (lanes.Step(
        "step", (sys.executable, "-c", ORPHANING), str(tmp_path), timeout=3.0),))],
        tmp_path / "results")
    try:
        done = started.result("orphaning", timeout=60)["step"]
    finally:
        started.close()
    assert done.returncode is None and "3 s timeout" in done.stderr
    grandchild = int(done.stdout.split()[0])
    assert proctable.wait_all_exit([grandchild], 10) == set()


def test_a_step_failing_with_the_retry_text_runs_again_and_is_counted(tmp_path):
    (tmp_path / "results").mkdir()
    started = lanes.Lanes([lanes.Job("failing", (
        lanes.Step("retried", (sys.executable, "-c", FAILING), str(tmp_path),
                   retry_on="teardown abort", tries=3),
        lanes.Step("once", (sys.executable, "-c", FAILING), str(tmp_path)),
        lanes.Step("other text", (sys.executable, "-c", FAILING), str(tmp_path),
                   retry_on="no such text", tries=3)))], tmp_path / "results")
    try:
        done = started.result("failing", timeout=60)
    finally:
        started.close()
    assert [(r.returncode, r.retries) for r in done.values()] == [(3, 2), (3, 0), (3, 0)]


def test_closing_stops_a_running_job_and_removes_its_files(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    marker = tmp_path / "pid"
    writes_pid = (f"import os, time\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\n"
                  "time.sleep(60)\n")
    started = lanes.Lanes([lanes.Job("long", (lanes.Step(
        "step", (sys.executable, "-c", writes_pid), str(tmp_path)),))], results)
    runner = started.runner.pid
    started.close()
    assert not proctable.alive(runner) and not results.exists()
    # the job had started, or never will (its runner is gone): either way it is not running
    if marker.exists() and marker.read_text():
        assert proctable.wait_all_exit([int(marker.read_text())], 10) == set()
