"""The line a live frame is at, even when Python reports none.

``frame.f_lineno`` (and ``traceback``'s ``lineno``) is None where the instruction the
frame is at carries no line (exception handling's own instructions, and some a loop
leaves without one): a spinning rank sampled there would be placed at line 0. The code
object still says where it is: a backward jump is at its loop's header (the line the jump
lands on); anything else is at the nearest line that starts before the instruction. Only
a code object with no line at all leaves it unknown (None), which a report says in words.
"""

from __future__ import annotations

import dis
from types import CodeType, FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distdoctor.models.record import Frame, Seen


def frame_line(frame: FrameType) -> int | None:
    """``frame``'s line, resolved from its code object when Python has none."""
    if frame.f_lineno is not None:
        return frame.f_lineno
    return code_line(frame.f_code, frame.f_lasti)


def code_line(code: CodeType, offset: int) -> int | None:
    """The line of the instruction at ``offset`` of ``code``: its own, the target's of a
    backward jump (the loop's header), or the nearest one starting before it."""
    lines = [(start, end, line) for start, end, line in code.co_lines()]
    own = next((line for start, end, line in lines if start <= offset < end), None)
    if own is not None:
        return own
    for instruction in dis.get_instructions(code):
        if instruction.offset == offset and "JUMP_BACKWARD" in instruction.opname \
                and isinstance(instruction.argval, int):
            target = code_line(code, instruction.argval)
            if target is not None:
                return target
    before = [line for start, _, line in lines if start <= offset and line is not None]
    return before[-1] if before else None


def where(filename: str, line: int | None, function: str) -> str:
    """'file:line', or, when no line is known, 'file (line unknown, in function)'."""
    return f"{filename}:{line}" if line else f"{filename} (line unknown, in {function})"


# a running rank is sampled this often as it is stopped, this far apart: 12 samples over
# about 60 ms see a loop's lines in proportion to the time spent on each
SAMPLES = 12
SAMPLE_GAP_S = 0.005
# ... and for no longer than this: each sample waits its turn at the GIL, which a rank
# spinning in Python holds, and on a machine whose cores are taken (a CPU hog beside four
# ranks) twelve turns outlasted the asker's patience, who then had no sample at all
SAMPLE_BUDGET_S = 0.4


def main_thread_seen(samples: int = SAMPLES, gap: float = SAMPLE_GAP_S,
                     budget: float = SAMPLE_BUDGET_S) -> tuple[Seen, ...]:
    """Where this process's main thread is in the user's own code, sampled ``samples``
    times ``gap`` apart, or as many as ``budget`` seconds allow (at least one; the caller
    is another thread; each sleep lets the main thread run on): ``Seen`` lines, most
    frequent first. () where no sample found user code."""
    import time

    from distdoctor.models.record import seen_most_first

    found = []
    ends = time.monotonic() + budget
    for index in range(samples):
        if index:
            if time.monotonic() >= ends:
                break
            time.sleep(gap)
        found.append(main_thread_at())
    return seen_most_first(found) if any(found) else ()


def main_thread_at() -> Frame | None:
    """The innermost frame of the user's own code the main thread is at now (its line
    resolved as ``frame_line`` does), or None when it is in none."""
    import sys
    import threading

    from distdoctor.models.record import Frame, is_user_frame

    main = threading.main_thread().ident
    frame = sys._current_frames().get(main) if main is not None else None
    while frame is not None:
        line = frame_line(frame)
        here = Frame(frame.f_code.co_filename, line or 0, frame.f_code.co_name)
        if is_user_frame(here):
            return here
        frame = frame.f_back
    return None
