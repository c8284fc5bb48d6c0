"""A frame's line when Python reports none (trace/lines.py), and faulthandler's 'line ???'
read as a frame whose line is unknown, never as line 0."""

from __future__ import annotations

import dis
import threading
import time

import pytest
from sources import line_number

from distdoctor.launch.stacks import parse_faulthandler
from distdoctor.models import Frame, seen_most_first
from distdoctor.models.record import seen_at_text
from distdoctor.trace.lines import (
    SAMPLE_BUDGET_S,
    code_line,
    main_thread_at,
    main_thread_seen,
    where,
)

pytestmark = pytest.mark.tier("unit")

SOURCE = """
def guarded(items):
    with open(__file__) as f:
        for x in items:
            x = x << 1
    return 1

def spin(n):
    seen = 1
    while seen < n:
        seen = seen << 1
    return seen
"""


def _code(name: str):
    space: dict = {}
    exec(compile(SOURCE, "s.py", "exec"), space)  # noqa: S102 (our own source, above)
    return space[name].__code__


def test_an_instruction_without_a_line_is_placed_at_the_nearest_line_before_it():
    code = _code("guarded")
    lineless = [start for start, _, line in code.co_lines() if line is None]
    assert lineless, "this Python gives every instruction a line: nothing to resolve"
    before = [line for start, line in dis.findlinestarts(code) if start <= lineless[0]]
    assert code_line(code, lineless[0]) == before[-1]


def test_an_instruction_with_a_line_keeps_it_and_a_back_edge_is_at_its_loop():
    code = _code("spin")
    for instruction in dis.get_instructions(code):
        assert code_line(code, instruction.offset) == instruction.positions.lineno
        if "JUMP_BACKWARD" in instruction.opname:
            assert code_line(code, instruction.offset) in (10, 11)  # the loop's lines


def test_no_line_is_said_in_words_not_as_line_0():
    assert where("s.py", None, "spin") == "s.py (line unknown, in spin)"
    assert where("s.py", 11, "spin") == "s.py:11"
    assert Frame("s.py", 0, "spin").place == "s.py (line unknown)"
    assert "line unknown" in str(Frame("s.py", 0, "spin"))


def test_faulthandler_line_unknown_is_a_frame_not_dropped():
    text = ('Thread 0x00007f0000000001 (most recent call first):\n'
            '  File "l76.py", line ??? in broadcast\n'
            '  File "l76.py", line 40 in <module>\n')
    stacks = parse_faulthandler(text)
    frames = [f for stack in stacks for f in stack.frames]
    assert [(f.file, f.line, f.function) for f in frames] == [
        ("l76.py", 40, "<module>"), ("l76.py", 0, "broadcast")]
    assert frames[-1].place == "l76.py (line unknown)"


def test_lines_seen_are_counted_most_frequent_first_and_unknown_only_when_alone():
    """A spinning rank sampled several times: each line once, with its count, the most
    frequent first (ties in file and line order); a sample outside the user's code counts
    only in the total, and a line that could not be resolved only where none could."""
    a, b, c = Frame("t.py", 9, "loop"), Frame("t.py", 8, "loop"), Frame("t.py", 0, "loop")
    seen = seen_most_first([a, b, a, None, c, a, b, Frame("s.py", 3, "f")])
    assert [(s.where, s.times, s.of) for s in seen] == [
        ("t.py:9", 3, 8), ("t.py:8", 2, 8), ("s.py:3", 1, 8)]
    assert seen_at_text(seen) == " (seen at t.py:9 (3 of 8), t.py:8 (2 of 8), s.py:3 (1 of 8))"
    assert seen_at_text(seen[:1]) == ""  # one line: already where it is said to be
    alone = seen_most_first([c, None])
    assert [(s.where, s.times, s.of) for s in alone] == [("t.py (line unknown)", 1, 2)]


def _main_thread_reaches(line: int) -> None:
    """Wait (on the helper thread) until the main thread is at ``line`` of this file."""
    deadline = time.monotonic() + 30
    while (at := main_thread_at()) is None or at.line != line:
        assert time.monotonic() < deadline, at
        time.sleep(0.001)


def test_the_main_thread_is_sampled_where_it_is_at_each_moment():
    """main_thread_at, called from another thread while the main thread waits at one line
    and then at another, finds it at each; several such samples make the list, the line
    seen most first."""
    # each marker is put together here, so that this line itself does not hold it
    first, second = (line_number(__file__, "# " + mark) for mark in ("FIRST WAIT",
                                                                       "SECOND WAIT"))
    moved, sampled, found = threading.Event(), threading.Event(), []

    def sampler() -> None:
        _main_thread_reaches(first)
        found.append(main_thread_at())
        sampled.set()
        moved.wait(30)
        _main_thread_reaches(second)
        found.append(main_thread_at())
        found.append(main_thread_at())
        sampled.set()

    helper = threading.Thread(target=sampler)
    helper.start()
    assert sampled.wait(30)  # FIRST WAIT
    sampled.clear()
    moved.set()
    assert sampled.wait(30)  # SECOND WAIT
    helper.join(30)
    seen = seen_most_first(found)
    assert [(s.where, s.times, s.of) for s in seen] == [
        (f"{__file__}:{second}", 2, 3), (f"{__file__}:{first}", 1, 3)]
    assert {s.frame.function for s in seen} == {
        "test_the_main_thread_is_sampled_where_it_is_at_each_moment"}


@pytest.mark.parametrize("samples, budget, taken", [
    (6, SAMPLE_BUDGET_S, 6),  # a waiting main thread: at its line in every sample
    # each sample waits its turn at the GIL: on a machine whose cores are taken, twelve
    # turns outlasted the asker's patience, who then had nothing. Past its budget the
    # sampler answers with the samples it took (at least one)
    (12, 0.0, 1),
])
def test_a_main_thread_that_waits_is_seen_at_its_line_in_each_sample_taken(
        samples, budget, taken):
    line = line_number(__file__, "# " + "SAMPLED WAIT")  # put together: not found here
    done, seen = threading.Event(), []

    def sampler() -> None:
        _main_thread_reaches(line)
        seen.extend(main_thread_seen(samples, 0.001, budget=budget))
        done.set()

    helper = threading.Thread(target=sampler)
    helper.start()
    assert done.wait(30)  # SAMPLED WAIT
    helper.join(30)
    assert [(s.where, s.times, s.of) for s in seen] == [(f"{__file__}:{line}", taken, taken)]
