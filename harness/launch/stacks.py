"""Stacks of a rank that cannot answer for itself.

A hung rank is usually blocked inside a C++ collective with the GIL released, so a small
thread in the rank can still walk every thread's frames and send them back structured
(file, line, function, source) on request. When even that thread cannot run (a C call
holding the GIL), the parent falls back to SIGUSR1: faulthandler dumps the raw text
without the GIL, into a pipe the parent reads.
"""

from __future__ import annotations

import faulthandler
import linecache
import os
import re
import runpy
import select
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection, wait
from types import FrameType
from typing import Any, cast

from distdoctor.models import Frame, ThreadStack
from distdoctor.trace.lines import frame_line

_RESPONDER_NAME = "distdoctor-stacks"
_HARNESS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# frames that only carry a job or a script to the user's code
CARRIERS = frozenset({os.path.join(_HARNESS, "launch", "rank.py"),
                      os.path.join(_HARNESS, "userjob", "__main__.py"),
                      os.path.join(_HARNESS, "userjob", "inrank", "bootstrap.py"),
                      runpy.__file__, "<frozen runpy>"})
# the wrapper between user code and torch
TRACER_FILE = os.path.join(_HARNESS, "trace", "tracer.py")
# a line a rank's own watch writes into its stacks file before each stall's dump, and when
# it moves past the stall: a reader keeps what follows the last one (older dumps are stale)
MARK = "# distdoctor:"
# faulthandler writes "line ???" where the frame's instruction carries no line
_FAULTHANDLER_FRAME = re.compile(
    r'File "(?P<file>[^"]*)", line (?P<line>\d+|\?\?\?) in (?P<func>\S+)')


def capture_stacks() -> tuple[ThreadStack, ...]:
    """Every thread's stack in this process except the caller's, main thread first."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main_ident = threading.main_thread().ident
    me = threading.get_ident()
    stacks = []
    for ident, top in sys._current_frames().items():
        if ident == me:
            continue
        frames = _below_rank_loop(tuple(_frame(f) for f, _ in reversed(list(
            traceback.walk_stack(top)))))
        stacks.append(ThreadStack(names.get(ident, f"0x{ident:x}"), ident == main_ident, frames))
    stacks.sort(key=lambda s: not s.main)
    return tuple(stacks)


def _frame(frame: FrameType) -> Frame:
    """A live frame as a Frame, its line resolved from its code object where Python has
    none (0 only where the code object has none either: said as "line unknown")."""
    line = frame_line(frame)
    code = linecache.getline(frame.f_code.co_filename, line).strip() if line else ""
    return Frame(frame.f_code.co_filename, line or 0, frame.f_code.co_name, code)


def _below_rank_loop(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """Drop the frames a forked rank inherited, the job loop and runpy: start at the
    job or the script itself."""
    carriers = [i for i, f in enumerate(frames) if f.file in CARRIERS]
    below = frames[carriers[-1] + 1:] if carriers else frames
    return tuple(f for f in below if f.file != TRACER_FILE)


def serve_stacks(conn: Connection) -> threading.Thread:
    """Answer every request on ``conn``, until the parent hangs up: "stacks" with this
    process's stacks, "collectives" with the collectives it has in flight, "history" with
    every collective its Flight Recorder holds (live.py), "seen" with the lines its main
    thread is seen at over several samples (a rank spinning in its own code moves),
    "loaded" with how many modules it has loaded (trace/loading.py). Each answer carries
    its request's serial number, so a late one is told from the next."""
    from distdoctor.dumps.live import history, in_flight
    from distdoctor.trace.lines import main_thread_seen
    from distdoctor.trace.loading import modules_loaded

    answers = {"collectives": in_flight, "history": history, "seen": main_thread_seen,
               "loaded": modules_loaded}

    def loop() -> None:
        while True:
            try:
                kind, serial = conn.recv()
                conn.send((serial, answers.get(kind, capture_stacks)()))
            except (EOFError, OSError):
                return

    thread = threading.Thread(target=loop, name=_RESPONDER_NAME, daemon=True)
    thread.start()
    return thread


def arm_faulthandler(write_fd: int) -> None:
    """Make SIGUSR1 dump every thread's stack into ``write_fd`` (no GIL needed)."""
    faulthandler.register(signal.SIGUSR1, file=os.fdopen(write_fd, "w"), all_threads=True)


def request_stacks(
    targets: list[tuple[Connection, int, int]], timeout: float = 0.5
) -> list[tuple[tuple[ThreadStack, ...], str | None]]:
    """Ask live ranks, all at once, for their stacks: (structured stacks, raw text) each.

    ``targets`` holds (stack connection, pid, faulthandler read fd) per rank. A rank whose
    stack thread does not answer within ``timeout`` gets SIGUSR1 and its faulthandler text.
    """
    answers: dict[int, tuple[tuple[ThreadStack, ...], str | None]] = {
        index: (stacks, None)
        for index, stacks in ask([conn for conn, _, _ in targets], "stacks", timeout).items()}
    silent = [i for i in range(len(targets)) if i not in answers]
    for index in silent:
        try:
            os.kill(targets[index][1], signal.SIGUSR1)
        except ProcessLookupError:
            pass
    for index in silent:
        raw = _read_until_quiet(targets[index][2], first=timeout, quiet=0.05)
        answers[index] = (parse_faulthandler(raw), raw or None)
    return [answers[i] for i in range(len(targets))]


_serial = 0  # numbers the requests this process sends


def ask(conns: list[Connection], kind: str, timeout: float) -> dict[int, Any]:
    """Ask each rank's stack thread, all at once; index -> answer, for those that answered
    within ``timeout``. A late answer to an earlier request is dropped."""
    global _serial
    _serial += 1
    answers: dict[int, object] = {}
    asked = {}
    for index, conn in enumerate(conns):
        try:
            conn.send((kind, _serial))
            asked[conn] = index
        except OSError:
            pass
    end = time.monotonic() + timeout
    while asked and (left := end - time.monotonic()) > 0:
        for ready in wait(list(asked), left):
            conn = cast(Connection, ready)
            try:
                serial, answer = conn.recv()
            except (EOFError, OSError):
                asked.pop(conn)
                continue
            if serial == _serial:
                answers[asked.pop(conn)] = answer
    return answers


def _read_until_quiet(fd: int, first: float, quiet: float) -> str:
    """Read what faulthandler writes: wait ``first`` for it to start, stop at ``quiet`` silence."""
    chunks: list[bytes] = []
    wait = first
    while select.select([fd], [], [], wait)[0]:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not data:
            break
        chunks.append(data)
        wait = quiet
    return b"".join(chunks).decode(errors="replace")


def parse_faulthandler(text: str, names: dict[str, str] | None = None
                       ) -> tuple[ThreadStack, ...]:
    """Turn faulthandler's text (innermost frame first) into ThreadStacks, main thread
    first, each distinct stack once (a rank that dumped at its deadline and again when
    stopped wrote the same stacks twice). faulthandler names threads by id alone:
    ``names`` maps ids ("0x00007f...") to thread names where the rank wrote them down;
    else every thread but the main one starts in threading's ``_bootstrap`` or has no
    Python frame at all (a thread started in C), so the one that does neither is the main
    thread."""
    names = names or {}
    stacks: list[ThreadStack] = []
    for block in re.split(r"\n(?=(?:Current thread|Thread) 0x)", text.strip()):
        lines = block.splitlines()
        if not lines or "0x" not in lines[0]:
            continue
        frames = tuple(reversed([
            Frame(m["file"], int(m["line"]) if m["line"].isdigit() else 0, m["func"])
            for m in map(_FAULTHANDLER_FRAME.search, lines[1:])
            if m
        ]))
        ident = lines[0].split("(")[0].replace("Current thread", "").replace("Thread", "")
        ident = ident.strip()
        if ident in names:
            main = names[ident] == "MainThread"
        else:  # the main thread runs the script: it has frames (a thread torch or the
            # runtime started in C has none), and they do not start in threading's
            main = bool(frames) and not (frames[0].function == "_bootstrap"
                                         and os.path.basename(frames[0].file) == "threading.py")
        stack = ThreadStack(names.get(ident, ident), main, _below_rank_loop(frames))
        if stack not in stacks:
            stacks.append(stack)
    if len({s.name for s in stacks if s.main}) > 1:  # not told apart: claim none, not guess
        stacks = [ThreadStack(s.name, False, s.frames) for s in stacks]
    stacks.sort(key=lambda s: not s.main)
    return tuple(stacks)
