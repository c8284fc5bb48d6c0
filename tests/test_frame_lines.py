"""A frame's line when Python reports none (trace/lines.py), and faulthandler's 'line ???'
read as a frame whose line is unknown, never as line 0."""

from __future__ import annotations

import dis

from distdoctor.launch.stacks import parse_faulthandler
from distdoctor.models import Frame
from distdoctor.trace.lines import code_line, where

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
