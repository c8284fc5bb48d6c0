"""The pytest plugin as a user meets it: their test files in a project of their own, run by
pytest in a subprocess, every outcome and failure text read back from the JUnit XML pytest
writes. The expected numbers and lines come from the case files' LINE markers and from
computing the same values here, not from the plugin."""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import proctable
import pytest
import torch
from sources import line_of
from torch import nn

pytestmark = pytest.mark.tier("e2e")

CASES = Path(__file__).parent / "plugin_cases"
EXAMPLE = Path(__file__).parent.parent / "examples" / "test_with_distdoctor.py"
RUN_TIMEOUT = 240  # seconds for one pytest subprocess; each finishes in well under 30

EXPECTED = {
    "test_all_reduce_sums": "passed",
    "test_broadcast_from_zero[world_size=2]": "passed",
    "test_broadcast_from_zero[world_size=3]": "passed",
    "test_all_gather[1]": "passed",
    "test_all_gather[5]": "passed",
    "test_one_rank_wrong": "failed",
    "test_send_send": "failed",
    "test_rank_returns_early": "failed",
    "test_collectives_differ": "failed",
    "test_rank_exits": "failed",
    "test_rank_killed": "failed",
    "test_one_rank_slow": "passed",
    "test_runs_after_failures": "passed",
    "test_skips_inside": "skipped",
    "test_skipif": "skipped",
    "test_xfail": "xfailed",
    "test_sum_property": "passed",
    "test_property_shrinks": "failed",
    "test_rank_failure_carries_its_cause": "passed",
    "test_replicas_agree": "passed",
    "test_replicas_differ": "failed",
    "test_ddp_trains_like_one_process": "passed",
    "test_hand_averaging_trains_like_one_process": "passed",
    "test_summed_gradients": "failed",
    "test_seeded_by_rank": "failed",
    "test_unused_parameters": "failed",
    "test_clipped_on_rank_zero": "failed",
    "test_scheduled_on_rank_zero": "failed",
    "test_momentum_resumed_on_rank_zero": "failed",
    "test_synced_on_the_first_micro_batch": "failed",
    "test_batch_norm_kept_per_rank": "failed",
    "test_resume_restores_every_state": "passed",
    "test_resume_from_rank_zeros_rng": "failed",
}


def case_line(case_file: str, marker: str) -> str:
    """``file:line`` of the line in a case file marked ``# LINE marker``."""
    return line_of(CASES / case_file, f"# LINE {marker}", base=CASES)


def _ranks(phrase: str) -> list[int]:
    """The ranks a report's phrase names: "2", "0-3", "0, 2"."""
    ranks = []
    for part in phrase.split(", "):
        low, _, high = part.partition("-")
        ranks.extend(range(int(low), int(high or low) + 1))
    return ranks


def project(tmp_path: Path, *case_files: str) -> Path:
    """A user's project: the case files and an empty pytest.ini, nothing of ours."""
    root = tmp_path / "project"
    root.mkdir()
    for name in case_files:
        shutil.copy(CASES / name, root / name)
    (root / "pytest.ini").write_text("[pytest]\n")
    return root


def environment(tag: str, **extra: str) -> dict[str, str]:
    return dict(os.environ, DISTDOCTOR_TEST_TAG=tag, **extra)


def pytest_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args]


def properties(xml: Path, test: str) -> dict[str, str]:
    """The properties the plugin recorded for ``test`` in pytest's JUnit XML."""
    for case in ET.parse(xml).iter("testcase"):
        if case.get("name") == test:
            return {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
    raise LookupError(test)


def outcomes(xml: Path) -> dict[str, tuple[str, str, float]]:
    """test name -> (outcome, failure or skip text, seconds), from pytest's JUnit XML."""
    found = {}
    for case in ET.parse(xml).iter("testcase"):
        outcome, text = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, text = "failed", (child.get("message") or "") + "\n" + (child.text or "")
            elif child.tag == "skipped":
                xfail = child.get("type") == "pytest.xfail"
                outcome, text = ("xfailed" if xfail else "skipped"), child.get("message") or ""
        found[case.get("name")] = (outcome, text, float(case.get("time")))
    return found


@pytest.fixture(scope="module")
def user_run(tmp_path_factory) -> dict[str, tuple[str, str, float]]:
    """The user's case file run once, as they would: ``pytest cases_user.py``."""
    root = project(tmp_path_factory.mktemp("user"), "cases_user.py")
    tag = uuid.uuid4().hex
    done = subprocess.run(pytest_command("cases_user.py", "--junitxml", "report.xml"),
                          cwd=root, env=environment(tag), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT)
    assert done.returncode == 1, done.stdout + done.stderr  # some tests fail, on purpose
    assert proctable.wait_all_exit(sorted(proctable.tagged(tag)), 10) == set()
    USER_RUN["stdout"], USER_RUN["xml"] = done.stdout, root / "report.xml"
    return outcomes(root / "report.xml")


USER_RUN: dict = {}  # the user file's run: its output and XML, for what outcomes leave out


def test_a_test_that_passes_while_one_rank_holds_the_others_up_says_so(user_run):
    """It passes (time is not correctness), with a warning in pytest's summary and a
    property in the JUnit XML naming the rank and what its slowness cost the other."""
    said = properties(USER_RUN["xml"], "test_one_rank_slow")["distdoctor straggler"]
    assert said.startswith("cases_user.py::test_one_rank_slow: straggler (rank 1 of 2): rank 1 "
                           "arrives last at the default group's collectives in ")
    # 20 ms of sleep before each all-reduce on rank 1: rank 0 waits nearly all of it
    late = float(said.split("a median ")[1].split(" ms after the others")[0])
    assert late >= 18.0
    assert "StragglerWarning: cases_user.py::test_one_rank_slow: straggler (rank 1 of 2)" \
        in USER_RUN["stdout"]


def test_every_test_of_the_user_file_ends_as_expected(user_run):
    assert {name: found[0] for name, found in user_run.items()} == EXPECTED


def test_a_failing_assertion_names_its_rank_with_pytest_s_explanation(user_run):
    text = user_run["test_one_rank_wrong"][1]
    assert "rank 1 of 2: AssertionError: assert 0.0 == 1" in text
    assert f"{case_line('cases_user.py', 'one_rank_wrong')}: AssertionError" in text
    assert "rank 0 of 2: finished" in text


def test_a_send_send_hang_is_proven_with_both_ranks_lines(user_run):
    text = user_run["test_send_send"][1]
    where = case_line("cases_user.py", "send_send")
    assert "deadlock proven: p2p-cycle (ranks 0, 1 of 2)" in text
    assert f"rank 0 of 2: waiting in send to 1 (#0, (4,), float32) at {where}" in text
    assert f"rank 1 of 2: waiting in send to 0 (#0, (4,), float32) at {where}" in text
    assert user_run["test_send_send"][2] < 30  # proven, not waited out (deadline: 300 s)


def test_a_rank_that_left_early_and_a_collective_mismatch_are_named(user_run):
    early = user_run["test_rank_returns_early"][1]
    barrier = case_line("cases_user.py", "barrier")
    assert "deadlock proven: rank-exited-early (rank 2 of 3)" in early
    assert f"ranks 0, 1 of 3: waiting in barrier (#0) at {barrier}" in early  # said once
    assert "rank 2 of 3: finished" in early
    differ = user_run["test_collectives_differ"][1]
    assert "deadlock proven: collective-mismatch (ranks 0, 1 of 2)" in differ
    assert f"rank 0 of 2: waiting in all_reduce (#0, (4,), float32) at " \
           f"{case_line('cases_user.py', 'all_reduce')}" in differ
    assert f"at {case_line('cases_user.py', 'broadcast')}" in differ


def test_a_rank_that_dies_is_named_with_its_exit(user_run):
    assert "rank 2 of 3 died: exited with code 7" in user_run["test_rank_exits"][1]
    assert "rank 1 of 2 died: killed by signal SIGKILL" in user_run["test_rank_killed"][1]


def test_a_skip_inside_a_rank_skips_the_test(user_run):
    assert "needs a GPU per rank" in user_run["test_skips_inside"][1]


def test_a_hypothesis_property_through_ranks_is_shrunk_to_the_smallest_failure(user_run):
    text = user_run["test_property_shrinks"][1]
    assert "x=25" in text  # the least x whose sum over 2 ranks reaches 50
    assert "the sum reached fifty" in text
    assert case_line("cases_user.py", "below_fifty") in text


def test_replicas_that_differ_are_named_by_entry_rank_and_gap(user_run):
    torch.manual_seed(0)
    first = nn.Linear(3, 2)
    torch.manual_seed(1)
    other = nn.Linear(3, 2)
    gap = (other.weight - first.weight).abs().max().item()
    text = user_run["test_replicas_differ"][1]
    assert f"param weight: ranks 1, 2 vs rank 0: max abs difference {gap:.3g}" in text


def test_a_resume_that_parts_from_the_training_never_stopped_is_named(user_run):
    """Rank 0's checkpoint, RNG state included, loaded by every rank: rank 1's dropout
    draws rank 0's masks after the resume."""
    text = user_run["test_resume_from_rank_zeros_rng"][1]
    assert "the resume after step 1 parts from the training never stopped" in text, text
    assert "rank 1: the RNG state and the gradients with it at step 2 after the resume " \
        "differ from the uninterrupted run's" in text
    assert f"loaded by every rank at {case_line('cases_user.py', 'resume-load')}" in text


def test_training_that_parts_from_one_process_is_given_its_cause(user_run):
    summed = user_run["test_summed_gradients"][1]
    assert "ranks 0, 1 of 2 part from one process after step 1" in summed
    assert "cause: sum-without-mean" in summed and "2.00x" in summed
    assert case_line("cases_user.py", "summing") in summed
    # the edit run --fix would make, where it changes the user's own step alone
    assert "suggested edit (sum-without-mean; the remedy distdoctor run --fix makes, " \
        "not re-run here: apply it and run the test again):" in summed
    assert "--- a/cases_user.py" in summed and "+++ b/cases_user.py" in summed
    hunk = re.search(r"@@ -(\d+),6 \+(\d+),7 @@", summed)  # one line added, none removed
    assert hunk and hunk[1] == hunk[2], summed
    assert "+        p.grad /= dist.get_world_size()" in summed
    seeded = user_run["test_seeded_by_rank"][1]
    assert "rank 1 of 2 parts from one process after build, before any step" in seeded
    assert "cause: divergent-parameters" in seeded
    # its remedy would edit another function of the file (build_ddp's model): not offered
    assert "suggested edit" not in seeded
    unused = user_run["test_unused_parameters"][1]
    assert "cause: unused-params" in unused and "b.weight, b.bias" in unused
    assert case_line("cases_user.py", "step") in unused


@pytest.mark.parametrize("test, parts, cause, marker", [
    ("test_clipped_on_rank_zero", "rank 1 of 2 parts from one process after step 1",
     "cause: rank-dependent-update (rank 0)", "clipped"),
    ("test_scheduled_on_rank_zero", "rank 1 of 2 parts from one process after step 2",
     "cause: rank-dependent-update (rank 0)", "scheduled"),
    ("test_momentum_resumed_on_rank_zero", "rank 1 of 2 parts from one process after step 1",
     "cause: rank-dependent-update (rank 0)", "loaded"),
    ("test_synced_on_the_first_micro_batch", "ranks 0, 1 of 2 part from one process after "
     "step 1", "cause: unsynced-microbatches (ranks 0, 1)", "micro"),
    # BatchNorm parts every rank from one process (each normalises its own half); the
    # replicas' running statistics parting from each other is the bug named
    ("test_batch_norm_kept_per_rank", "ranks 0, 1 of 2 part from one process after step 1",
     "cause: divergent-buffers (rank 1)", "step"),
])
def test_replicas_that_part_silently_are_given_the_update_that_parted_them(user_run, test,
                                                                          parts, cause,
                                                                          marker):
    """Same gradient, different update (clipped, scheduled or resumed on one rank), or a
    gradient left unsynchronised: each parts from one process (the one process is rank 0,
    which clips, schedules and resumes too: rank 1 is the one that parts from it), and the
    detectors' cause names the rank that did it and its line."""
    text = user_run[test][1]
    assert parts in text and cause in text, text
    assert case_line("cases_user.py", marker) in text


def test_the_same_file_under_xdist_ends_the_same(tmp_path):
    pytest.importorskip("xdist")
    root = project(tmp_path, "cases_user.py")
    tag = uuid.uuid4().hex
    subprocess.run(pytest_command("-n", "2", "cases_user.py", "--junitxml", "report.xml"),
                   cwd=root, env=environment(tag), capture_output=True, timeout=RUN_TIMEOUT)
    assert {name: found[0] for name, found in outcomes(root / "report.xml").items()} \
        == EXPECTED
    assert proctable.wait_all_exit(sorted(proctable.tagged(tag)), 10) == set()


def test_a_hang_nobody_can_prove_fails_within_the_deadline_and_three_seconds(tmp_path):
    root = project(tmp_path, "cases_stop.py")
    # the pool is formed by the test before, so the time below is the stopped test's own
    subprocess.run(pytest_command("cases_stop.py", "-k", "warm or past_deadline or bigint",
                                  "--junitxml", "report.xml", "-o",
                                  "junit_logging=system-out"),
                   cwd=root, env=environment("spin"), capture_output=True, timeout=RUN_TIMEOUT)
    outcome, text, seconds = outcomes(root / "report.xml")["test_spin_past_deadline"]
    assert outcome == "failed" and seconds < 2 + 3
    case = next(c for c in ET.parse(root / "report.xml").iter("testcase")
                if c.get("name") == "test_spin_past_deadline")
    printed = case.find("system-out").text
    assert all(f"[rank{r}]:rank {r} starts" in printed for r in range(3))  # though stopped
    assert "timed out (still running at the deadline of 2.0 s)" in text
    assert f"rank 0 of 3: running test_spin_past_deadline at " \
           f"{case_line('cases_stop.py', 'spin')}, in no collective" in text
    assert f"waiting in barrier (#0) at {case_line('cases_stop.py', 'barrier')}" in text
    # every rank of four spinning on a growing big-int shift: each at a line of its loop
    outcome, text, _ = outcomes(root / "report.xml")["test_bigint_spin_on_every_rank"]
    first, last = (int(case_line("cases_stop.py", m).rsplit(":", 1)[1])
                   for m in ("loop-start", "loop-end"))
    places = re.findall(r"ranks? ([\d, -]+) of 4: running test_bigint_spin_on_every_rank "
                        r"at cases_stop\.py:(\d+)", text)
    located = sorted(rank for ranks, _ in places for rank in _ranks(ranks))
    assert outcome == "failed" and located == [0, 1, 2, 3], text
    assert all(first < int(line) < last for _, line in places), text
    assert not re.search(r"\.py:0\b", text) and "line ???" not in text


def _run_until_reached(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, set[int]]:
    """Start pytest on cases_stop.py; return it and every process it started once the
    test has written to the FIFO."""
    root = project(tmp_path, "cases_stop.py")
    fifo = tmp_path / "reached"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # never sees end-of-file
    tag = uuid.uuid4().hex
    child = subprocess.Popen(pytest_command("cases_stop.py", *args), cwd=root,
                             env=environment(tag, DISTDOCTOR_CASES_FIFO=str(fifo)),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             preexec_fn=proctable.interruptible)
    try:
        ready, _, _ = select.select([reader], [], [], 120)
        assert ready, "the case never reached its point"
        return child, proctable.tagged(tag) - {child.pid}
    except BaseException:
        child.kill()
        child.communicate()
        raise
    finally:
        os.close(reader)


def test_ctrl_c_during_a_test_leaves_no_rank_behind(tmp_path):
    child, ranks = _run_until_reached(tmp_path, "-k", "until_interrupted")
    assert len(ranks) >= 2  # the ranks were there to be reaped
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=60)
    assert "KeyboardInterrupt" in out
    assert proctable.wait_all_exit(sorted(ranks), 10) == set()


def test_pytest_timeout_ending_the_process_takes_the_warm_ranks_with_it(tmp_path):
    # 8 s: time enough to form the pool on a busy machine before the test blocks
    child, ranks = _run_until_reached(tmp_path, "-k", "parent_blocks", "--timeout", "8",
                                      "--timeout-method", "thread")
    assert len(ranks) >= 2
    out, _ = child.communicate(timeout=60)
    assert "Timeout" in out and child.returncode != 0
    assert proctable.wait_all_exit(sorted(ranks), 10) == set()


def test_the_plugin_turns_off_with_no_distdoctor(tmp_path):
    root = project(tmp_path, "cases_user.py")
    done = subprocess.run(pytest_command("-p", "no:distdoctor", "cases_user.py", "-k",
                                         "all_reduce_sums", "--junitxml", "report.xml"),
                          cwd=root, capture_output=True, timeout=RUN_TIMEOUT)
    assert done.returncode == 1
    outcome, text, _ = outcomes(root / "report.xml")["test_all_reduce_sums"]
    assert outcome == "failed" and "fixture 'rank' not found" in text


def test_the_readme_s_example_file_passes_in_a_project_of_its_own(tmp_path):
    root = project(tmp_path)
    shutil.copy(EXAMPLE, root / EXAMPLE.name)
    done = subprocess.run(pytest_command(EXAMPLE.name, "--junitxml", "report.xml"),
                          cwd=root, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {name: found[0] for name, found in outcomes(root / "report.xml").items()} == {
        "test_all_reduce_sums[world_size=2]": "passed",
        "test_all_reduce_sums[world_size=4]": "passed",
        "test_broadcast_reaches_every_rank[0]": "passed",
        "test_broadcast_reaches_every_rank[1]": "passed",
        "test_ddp_replicas_stay_identical": "passed",
        "test_hand_written_data_parallel_trains_like_one_process": "passed",
        "test_every_rank_learns_every_length": "passed"}


def test_loading_the_plugin_imports_no_torch():
    """pytest loads the plugin at every start in an environment that has distdoctor."""
    done = subprocess.run([sys.executable, "-c", "import sys, distdoctor.testing.plugin; "
                           "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr
