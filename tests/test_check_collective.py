"""distdoctor check-collective on user-style implementations, correct and broken."""

from __future__ import annotations

import re

import collective_impls
import pytest
from sources import line_number

from distdoctor.cli.main import main

pytestmark = pytest.mark.tier("e2e")

IMPLS = collective_impls.__name__


def impl_line(marker: str) -> int:
    """The line of collective_impls.py marked ``# marker``."""
    return line_number(collective_impls.__file__, f"# {marker}")


def check(capsys, function: str, kind: str, *extra: str) -> tuple[int, str]:
    code = main(["check-collective", f"{IMPLS}:{function}", "--kind", kind,
                 "--examples", "40", *extra])
    return code, capsys.readouterr().out


@pytest.mark.parametrize("function, kind, extra", [
    ("ring_allreduce", "allreduce", []),
    ("ring_avg", "allreduce", ["--op", "avg"]),
    ("broadcast", "broadcast", []),
    ("allgather", "allgather", []),
    ("reduce_scatter", "reduce_scatter", []),
])
def test_correct_implementations_pass(capsys, function, kind, extra):
    code, printed = check(capsys, function, kind, *extra)
    assert code == 0, printed
    assert "OK: every property held on 40 examples" in printed


def test_a_ring_that_sends_the_chunk_one_ahead_fails_in_its_own_reshape(capsys):
    """Shrunk to world size 2 and one element, the chunks are [x] and []: sending the
    one ahead loses x, and the final reshape to one element refuses, on every rank."""
    code, printed = check(capsys, "ring_wrong_chunk_index", "allreduce")
    assert code == 1 and "smallest failing example (shrunk by hypothesis)" in printed
    assert "world size 2, 1 float32 element per rank" in printed
    line = f"collective_impls.py:{impl_line('RESHAPE-LINE')}"
    assert all(f"rank {r}: RuntimeError: shape '[1]' is invalid for input of size 0 at "
               in printed for r in (0, 1))
    assert printed.count(line) >= 2


def _example(printed: str) -> tuple[list[float], float, float]:
    """The shrunk example: each rank's one input, the expected value, rank 0's result."""
    inputs = [float(v) for v in re.findall(r"rank \d+: \[(-?[\d.]+)\]",
                                           printed.split("inputs:")[1].split("\n")[0])]
    expected = float(re.search(r"expected: \[(-?[\d.]+)\] on every rank", printed)[1])
    got = float(re.search(r"got: rank 0: expected \[[^]]*\] \(float32\), got "
                          r"\[(-?[\d.]+)\]", printed)[1])
    return inputs, expected, got


def test_a_ring_one_reduce_step_short_gives_a_wrong_sum(capsys):
    code, printed = check(capsys, "ring_off_by_one", "allreduce")
    assert code == 1 and "wrong result" in printed and "world size 2," in printed
    inputs, expected, got = _example(printed)
    assert expected == sum(inputs) and got != expected


def test_an_average_that_never_divides_gives_the_sum(capsys):
    code, printed = check(capsys, "ring_avg_without_division", "allreduce", "--op", "avg")
    assert code == 1 and "wrong result" in printed and "world size 2," in printed
    inputs, expected, got = _example(printed)
    assert expected == sum(inputs) / 2 and got == sum(inputs)


def test_a_broadcast_that_only_works_from_rank_0_fails_from_another_source(capsys):
    code, printed = check(capsys, "broadcast_from_zero_only", "broadcast")
    assert code == 1 and "source rank 1" in printed


def test_a_hang_is_proven_whatever_the_deadline_and_says_who_waited_where(capsys):
    """Rank 0 returns without sending: rank 1's receive waits for a rank that finished."""
    code, printed = check(capsys, "allgather_rank0_never_sends", "allgather",
                          "--deadline", "300", "--world-sizes", "2-3")
    assert code == 1 and ": hang" in printed
    hang_line = f"collective_impls.py:{impl_line('HANG-LINE')}"
    assert "deadlock proven: rank 0 finished while rank 1 waits in recv from 0" in printed
    assert hang_line in printed


def test_an_unloadable_target_is_a_usage_error(capsys):
    assert main(["check-collective", "nope_module:f", "--kind", "allreduce"]) == 2
    assert main(["check-collective", f"{IMPLS}", "--kind", "allreduce"]) == 2


def test_a_rank_that_spins_is_stopped_at_the_deadline_and_located(capsys):
    """A broadcast that loops forever without a send or receive when the source is not
    rank 0: each rank is stopped within the deadline plus a second (not the deadline plus
    ten, as before), and the report gives the function and line it was running and that it
    never entered a send or receive."""
    code, printed = check(capsys, "tree_broadcast_spins_off_root0", "broadcast",
                          "--deadline", "1", "--world-sizes", "2-3")
    assert code == 1 and ": hang" in printed and "source rank 1" in printed, printed
    first, last = impl_line("SPIN-START"), impl_line("SPIN-END")
    places = re.findall(r"never entered one: running tree_broadcast_spins_off_root0 at "
                        r"(\S+):(\d+)", printed)
    assert len(places) == 2, printed  # both ranks of the shrunk example
    assert all(path == collective_impls.__file__ and first < int(line) < last
               for path, line in places)
    stopped = [float(s) for s in re.findall(r"stopped ([\d.]+) s after the start", printed)]
    assert len(stopped) == 2 and all(1.0 <= s <= 1.0 + 1.0 for s in stopped), stopped


@pytest.mark.timeout(120)
def test_a_pure_python_spin_is_located_on_every_rank_at_a_line_of_its_loop(capsys):
    """A broadcast that spins on a growing big-int shift when the source is not 0, at 4
    ranks: every rank is located at a real line of its loop (never line 0, where an
    instruction without a line once put them)."""
    code, printed = check(capsys, "tree_broadcast_bigint_spin", "broadcast",
                          "--deadline", "1", "--world-sizes", "4")
    assert code == 1 and ": hang" in printed, printed
    first, last = impl_line("BIGINT-START"), impl_line("BIGINT-END")
    places = re.findall(r"never entered one: running tree_broadcast_bigint_spin at "
                        r"(\S+):(\d+)", printed)
    assert len(places) == 4, printed  # every rank of the shrunk example
    assert all(path == collective_impls.__file__ and first < int(line) < last
               for path, line in places), places
    assert ":0 " not in printed and ":0\n" not in printed and "line ???" not in printed


def test_a_send_first_ring_passes_a_buffered_wire_and_deadlocks_a_rendezvous(capsys):
    """Every rank sends before it receives: a queue that buffers lets it through; a wire
    where a send waits for its receive (gloo, NCCL with large messages, MPI_Ssend) shows
    the cycle, with each rank's line and the fix."""
    code, printed = check(capsys, "ring_allreduce_send_first", "allreduce",
                          "--transport", "buffered")
    assert code == 0, printed
    code, printed = check(capsys, "ring_allreduce_send_first", "allreduce", "--deadline", "1")
    assert code == 1 and ": deadlock on the rendezvous transport" in printed, printed
    assert "world size 2," in printed
    assert "ordering deadlock on the rendezvous transport: ranks 0 -> 1 -> 0" in printed
    send_line = f"collective_impls.py:{impl_line('SEND-FIRST-LINE')}"
    for rank, peer in ((0, 1), (1, 0)):
        assert re.search(rf"rank {rank} in send to rank {peer} at \S*{send_line}", printed)
    assert "even ranks send first, odd ranks receive first" in printed


def test_correct_rings_pass_the_rendezvous_wire_too(capsys):
    """isend, recv, wait: no cycle, whatever the wire; broadcast's blocking sends meet
    their receives."""
    for function, kind in (("ring_allreduce", "allreduce"), ("broadcast", "broadcast")):
        code, printed = check(capsys, function, kind, "--transport", "rendezvous")
        assert code == 0, printed


def test_a_deadlock_is_closed_from_a_stopped_rank_s_reported_wait():
    """The race the suite once lost: rank 0's send timed out and raised, but the pool
    stopped rank 1 before its own timeout. Rank 1's transport had reported whom it waited
    for, and its stack says where: the cycle is still found, with both lines."""
    from distdoctor.collectives.checker import deadlock_text, wait_cycle
    from distdoctor.models import Frame, RankEnd, ThreadStack

    raised = RankEnd(0, "raised", error=(
        'Traceback (most recent call last):\n  File "/u/impl.py", line 44, in ring\n'
        "SendTimeout: rank 0 waited 1 s in allreduce (impl:ring) in send to rank 1, which "
        "never received it"))
    stack = ThreadStack("MainThread", True, (Frame("/u/impl.py", 44, "ring"),))
    stopped = RankEnd(1, "hung", stacks=(stack,))
    ends, events = (raised, stopped), ((), (("transport-call", "send"), ("waiting", "send", 0)))
    assert wait_cycle(ends, events) == [0, 1]
    text = deadlock_text([0, 1], ends, events, "rendezvous")
    assert ("rank 0 in send to rank 1 at /u/impl.py:44; rank 1 in send to rank 0 at "
            "/u/impl.py:44") in text
    assert wait_cycle(ends, ((), ())) == []  # without rank 1's report there is no cycle


def test_a_deadlock_the_watch_proved_is_closed_from_the_calls_its_traces_hold_open():
    """The race the suite lost next (hang_time's smoke run, on a loaded machine): the
    watch proved the cycle from both ranks' open sends and stopped them before either
    transport had waited the 0.05 s after which it reports whom it waits for. The proof's
    own evidence, each rank's open send in its trace, closes the cycle; a trace alone,
    for a rank not stopped by a proof, does not (a buffered send is open for an instant)."""
    from distdoctor.analysis.waitfor import PROVEN
    from distdoctor.collectives.checker import deadlock_text, wait_cycle
    from distdoctor.models import RankEnd

    def trace(rank: int, peer: int) -> tuple[dict, ...]:
        return ({"ev": "enter", "id": 1, "op": "send", "peer": peer, "where": "/u/a.py:7"},
                {"ev": "done", "id": 1},
                {"ev": "enter", "id": 2, "op": "isend", "peer": peer, "where": "/u/a.py:9"},
                {"ev": "enter", "id": 3, "op": "recv", "peer": peer, "where": "/u/a.py:8"},
                {"ev": "done", "id": 3})

    proven = f"{PROVEN}: ranks 0 -> 1 -> 0 each wait for the next"
    ends = (RankEnd(0, "hung", error=proven), RankEnd(1, "hung", error=proven))
    traces, events = (trace(0, 1), trace(1, 0)), ((), ())
    assert wait_cycle(ends, events, traces) == [0, 1]
    assert ("rank 0 in send to rank 1 at /u/a.py:9; rank 1 in send to rank 0 at /u/a.py:9"
            in deadlock_text([0, 1], ends, events, "rendezvous", traces))
    unproven = (RankEnd(0, "hung"), RankEnd(1, "hung"))
    assert wait_cycle(unproven, events, traces) == []
    closed = tuple(t + ({"ev": "done", "id": 2},) for t in traces)
    assert wait_cycle(ends, events, closed) == []


def test_a_call_the_transport_does_not_take_fails_on_the_first_example(capsys):
    """A torch-style recv(buffer, src) fails alike on every example: said at once, with
    the transport's methods, instead of shrinking over a hundred examples (25 s)."""
    code, printed = check(capsys, "torch_style_recv", "allreduce", "--examples", "200")
    assert code == 1 and "FAILED (after 1 example, counting" in printed
    line = f"collective_impls.py:{impl_line('MISUSE-LINE')}"
    assert ("your function calls the transport with arguments it does not take, on the "
            "first example:\n  rank ") in printed
    assert "recv(<tensor (" in printed and line in printed
    assert ("does not fit the transport's recv(src) -> tensor (too many positional "
            "arguments) at ") in printed
    assert "the transport's methods: send(tensor, dst); recv(src) -> tensor;" in printed


def test_help_lists_the_transport_and_a_check_leaves_no_hypothesis_folder(tmp_path):
    """Run as a user would, from their own folder: --help names each method, and checking
    leaves nothing behind (hypothesis keeps caches in ./.hypothesis by default)."""
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "mine.py").write_text(Path(collective_impls.__file__).read_text())
    shown = subprocess.run([sys.executable, "-m", "distdoctor", "check-collective", "--help"],
                           capture_output=True, text=True, cwd=tmp_path, timeout=60)
    for call in ("t.send(tensor, dst)", "t.recv(src) -> tensor", "t.isend(tensor, dst)",
                 "t.exchange(tensor, dst, src) -> tensor", "t.rank, t.world_size"):
        assert call in shown.stdout
    done = subprocess.run([sys.executable, "-m", "distdoctor", "check-collective",
                           "mine:ring_allreduce", "--kind", "allreduce", "--examples", "5",
                           "--world-sizes", "2"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.py"]
