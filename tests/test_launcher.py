"""launch(): fresh ranks, every outcome, and nothing left behind (checked in /proc)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import jobs
import proctable
import pytest
from sources import line_number

from distdoctor.launch.pool import launch
from distdoctor.launch.watch import PROVEN
from distdoctor.models import Frame

pytestmark = pytest.mark.tier("e2e")

JOBS = jobs.__file__

TESTS = Path(__file__).parent


@pytest.fixture
def no_new_children():
    """Fail the test if it leaves a live child process of ours behind."""
    before = proctable.children()
    yield
    left = proctable.children() - before
    assert not left, f"processes left behind: {sorted(left)}"


@pytest.mark.parametrize("world_size", [2, 4])
def test_every_rank_returns_its_value(world_size, no_new_children):
    result = launch(jobs.rank_sum, 3, world_size=world_size, deadline=10)
    expected = float(world_size * (world_size + 1) // 2)
    assert result.ok
    assert result.values == tuple([expected] * 3 for _ in range(world_size))
    assert [e.rank for e in result.ends] == list(range(world_size))


def test_a_rank_that_began_to_abort_ends_by_its_abort_not_by_our_stop(no_new_children):
    """A rank whose stderr already shows faulthandler's "Fatal Python error: Aborted" when
    the error grace ends is aborting by itself: it is waited for, and it ends by SIGABRT,
    which the report explains. Under load, gloo's abort once outlasted the grace and the
    rank read as stopped by us."""
    result = launch(jobs.abort_slowly_after_a_peer_raises, world_size=2, deadline=60,
                    error_grace=1.0)
    first, second = result.ends
    assert first.status == "raised" and "rank 0 saw the size mismatch first" in first.error
    assert second.status == "died" and second.exitcode == -6, second
    assert "killed by signal SIGABRT" in second.error


def test_raising_rank_is_reported_with_its_traceback_and_stops_the_rest(no_new_children):
    result = launch(jobs.raise_on_rank, 1, world_size=3, deadline=60)
    root = result.root_cause
    assert root is not None and root.rank == 1 and root.status == "raised"
    assert "ValueError: rank 1 is broken" in root.error
    raised_at = line_number(JOBS, "# RAISE-LINE")
    assert f'{jobs.__file__}", line {raised_at}, in raise_on_rank' in root.error
    others = [e for e in result.ends if e.rank != 1]
    assert all(not e.ok for e in others)
    # stopped long before any group timeout: within 2 s of the failure
    assert max(e.at for e in result.ends) - root.at < 2.0
    assert result.wall_s < 2.0 + root.at


@pytest.mark.timeout(30)
def test_a_rank_failing_while_a_proof_is_unconfirmed_leaves_the_error_grace_to_decide(
        no_new_children):
    """A proof still being confirmed when a rank raises is dropped: the waiting ranks are
    stopped after the grace (before, the watch woke at once forever, a CI hang)."""
    result = launch(jobs.cycle_unsettled_then_a_peer_raises, world_size=3, deadline=60,
                    error_grace=0.5)
    assert [e.status for e in result.ends] == ["stopped", "stopped", "raised"], result.ends
    assert result.wall_s < 10


def test_rank_that_cannot_be_interrupted_is_stopped_after_the_grace(no_new_children):
    result = launch(jobs.raise_while_peer_waits, world_size=2, deadline=60, error_grace=0.5)
    assert result.root_cause.rank == 0
    peer = result.ends[1]
    assert peer.status == "stopped"
    assert peer.at - result.ends[0].at < 2.0
    main = next(s for s in peer.stacks if s.main)
    assert (main.frames[0].file, main.frames[0].line) == (jobs.__file__,
                                                          line_number(JOBS, "# PEER-WAIT-LINE"))


def test_a_proven_hang_captures_every_thread_of_every_rank_then_kills(no_new_children):
    """A receive cycle is proven from the calls, long before the deadline."""
    deadline = 60.0
    result = launch(jobs.p2p_cycle_with_helper_thread, world_size=3, deadline=deadline)
    assert [e.status for e in result.ends] == ["hung"] * 3
    assert all(e.error.startswith(PROVEN + ": ranks 0 -> 1 -> 2 -> 0") for e in result.ends)
    assert result.wall_s < deadline
    for end in result.ends:
        main = next(s for s in end.stacks if s.main)
        user = [f for f in main.frames if f.file == jobs.__file__]
        assert (user[-1].function, user[-1].line) == ("p2p_cycle_with_helper_thread",
                                                      line_number(JOBS, "# RECV-LINE"))
        innermost = main.frames[-1]  # down inside torch's blocking call
        assert (Path(innermost.file).name, innermost.function) == ("distributed_c10d.py", "recv")
        assert any(s.name == f"helper-{end.rank}" for s in end.stacks)


def test_rank_holding_the_gil_is_dumped_by_faulthandler_and_diagnosed_there(no_new_children):
    from distdoctor.userjob.reporting.record import explain, script_record
    from distdoctor.userjob.reporting.report import render

    result = launch(jobs.hold_the_gil, world_size=2, deadline=1.0)
    where = f"{jobs.__file__}:{line_number(JOBS, '# GIL-LINE')}"
    for end in result.ends:
        assert end.status == "hung"
        assert end.raw_stack and "hold_the_gil" in end.raw_stack
        assert [s.main for s in end.stacks] == [True, False]  # the stack thread is not main
        assert end.stacks[0].frames[0] == Frame(jobs.__file__, line_number(JOBS, "# GIL-LINE"),
                                                "hold_the_gil")
    text = render(explain(script_record(result.ends, result.traces, result.wall_s,
                                         result.started, 1.0), "hold_the_gil"))
    # both ranks at the same line: said once for both
    assert f"ranks 0, 1: running, in no collective or send/receive: hold_the_gil at " \
           f"{where}" in text
    assert f"look at: {where}" in text


def test_rank_that_dies_is_reported_with_its_exit_code(no_new_children):
    result = launch(jobs.die_on_rank, 0, 7, world_size=2, deadline=30)
    root = result.root_cause
    assert (root.rank, root.status, root.exitcode) == (0, "died", 7)
    assert "exited with code 7" in root.error
    assert not result.ends[1].ok


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
                         ids=lambda s: s.name)
def test_killing_the_parent_takes_every_rank_within_two_seconds(signum, private_tmp):
    world_size = 3
    env, tmpdir = private_tmp
    env["PYTHONPATH"] = str(TESTS)
    parent = subprocess.Popen([sys.executable, str(TESTS / "hang_parent.py"), str(world_size)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                              text=True)
    try:
        pids = [int(parent.stdout.readline().split()[1]) for _ in range(world_size)]
        assert all(proctable.alive(pid) for pid in pids)
        parent.send_signal(signum)
        assert proctable.wait_all_exit(pids, timeout=2.0) == set()
        # the ranks are the claim; the parent's own exit is an interpreter shutdown with
        # torch loaded (0.5-1.9 s idle here, over 2 s once on a machine 3x oversubscribed)
        parent.wait(timeout=30.0)
    finally:
        parent.kill()
        parent.wait()
    assert not any(proctable.alive(pid) for pid in pids)
    assert list(tmpdir.iterdir()) == []  # no temporary file survives


def test_slow_ranks_waiting_on_each_other_are_never_called_deadlocked(no_new_children):
    """A straggler in an all-reduce, a receive while the peer computes, pipeline stages
    waiting on compute: each wait lasts many times the proof's confirmation window, and
    the job must simply finish."""
    result = launch(jobs.slow_but_healthy, 2.0, world_size=2, deadline=60)
    assert [e.status for e in result.ends] == ["finished", "finished"], result.ends
    assert result.values == ([5.0] * 4, [4.0] * 4)  # 2 after the sum, +1 a round trip


def test_a_rank_loading_code_past_the_deadline_is_moving_not_hung(no_new_children):
    """Both ranks import fresh modules for 2.4 s, a deadline of 1 s, with no call between
    (DDP's first construction under a CPU hog once read as a hang): the module count
    grows, so the job runs on and finishes. A rank that stops loading is still stopped at
    the deadline (the spinning and blocked ranks' tests)."""
    result = launch(jobs.all_reduce_after_slow_imports, 12, 0.2, world_size=2, deadline=1.0)
    assert [e.status for e in result.ends] == ["finished", "finished"], result.ends
    assert result.values == (2.0, 2.0)
    assert result.wall_s >= 12 * 0.2  # it did outlast its deadline


def test_a_straggler_in_ddp_is_never_called_deadlocked(no_new_children):
    """The others wait in a loss all-reduce while the last rank sleeps: the watch asks the
    Flight Recorder (DDP's collectives are made from C++) and must find nothing to prove."""
    result = launch(jobs.ddp_with_a_straggler, 1.0, world_size=3, deadline=60)
    assert [e.status for e in result.ends] == ["finished"] * 3, result.ends
    assert len(set(map(tuple, result.values))) == 1  # every rank saw the same losses


FAULTHANDLER_TEXT = """Thread 0x00007f2a1c9ff6c0 (most recent call first):
  File "/usr/lib/python3.11/multiprocessing/connection.py", line 395 in _recv
  File "/work/harness/launch/stacks.py", line 73 in loop
  File "/usr/lib/python3.11/threading.py", line 982 in run
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f2a3a81cb80 (most recent call first):
  File "/usr/lib/python3.11/re/__init__.py", line 166 in match
  File "/home/me/train.py", line 12 in step
  File "/home/me/train.py", line 30 in <module>
"""


def test_faulthandler_text_is_parsed_main_thread_first_outermost_frame_first():
    from distdoctor.launch.stacks import parse_faulthandler

    main, helper = parse_faulthandler(FAULTHANDLER_TEXT)
    assert (main.name, main.main, helper.name, helper.main) == \
        ("0x00007f2a3a81cb80", True, "0x00007f2a1c9ff6c0", False)
    assert [(f.file, f.line, f.function) for f in main.frames] == [
        ("/home/me/train.py", 30, "<module>"), ("/home/me/train.py", 12, "step"),
        ("/usr/lib/python3.11/re/__init__.py", 166, "match")]
    assert helper.frames[0].function == "_bootstrap" and len(helper.frames) == 4
    assert str(main).startswith("Thread 0x00007f2a3a81cb80 (main), most recent call last:")
