"""A live process's Python stacks, read from outside by py-spy, without stopping it.

``py-spy dump --nonblocking`` reads the interpreter's memory through ptrace's cousin
``process_vm_readv``: the process is neither paused nor changed (``--nonblocking``), which
is what a job someone else started, hung on a cluster, may ask of us. A stack read while
the process runs can be torn; the caller reads each rank more than once and trusts what
repeats. py-spy's JSON gives each frame's locals' reprs too (``--locals``), which is where
a rank started by ``mp.spawn`` keeps its rank (``_wrap``'s ``i``) and a blocked send its
peer (``dst``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from distdoctor.models.record import Frame, ThreadStack

PYSPY_TIMEOUT_S = 10.0


class StackReadError(RuntimeError):
    """py-spy could not read a process (missing, not permitted, not Python, gone)."""


class FramesMoved(StackReadError):
    """py-spy, reading without pausing, found a frame freed or rewritten under it ("Failed
    to copy PyFrameObject ... Bad address"): the process was running its Python code. A
    timeout or a refusal says nothing of the kind."""


@dataclass(frozen=True)
class Snapshot:
    """One read of a process: its threads' stacks (outermost frame first, as the rest of
    distdoctor keeps them) and, per thread, each frame's locals (name -> repr)."""

    pid: int
    threads: tuple[ThreadStack, ...]
    locals: tuple[tuple[dict[str, str], ...], ...]  # per thread, per frame (outermost first)
    gil: tuple[bool, ...]  # per thread: held the GIL when read

    def key(self) -> tuple:
        """What two reads of a rank that has not moved share."""
        return tuple((t.name, tuple((f.file, f.line, f.function) for f in t.frames))
                     for t in self.threads)


def executable() -> str:
    """The py-spy installed with distdoctor (beside this Python), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    found = beside if os.access(beside, os.X_OK) else shutil.which("py-spy")
    if not found:
        raise StackReadError("py-spy is not installed: pip install py-spy==0.4.3 (make "
                             "installs it)")
    return found


def dump(pid: int, with_locals: bool = True) -> Snapshot:
    """Read ``pid``'s Python stacks once, without pausing it."""
    argv = [executable(), "dump", "--nonblocking", "--json", "--pid", str(pid)]
    if with_locals:
        argv.append("--locals")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PYSPY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise StackReadError(f"py-spy took over {PYSPY_TIMEOUT_S:g} s to read process "
                             f"{pid}") from None
    if done.returncode != 0:
        said = done.stderr or done.stdout
        if "Failed to copy" in said or "Bad address" in said:
            raise FramesMoved(f"py-spy: {' '.join(said.split())[:200]}")
        raise StackReadError(_why(pid, said))
    try:
        threads = json.loads(done.stdout)
    except ValueError:
        raise StackReadError(f"py-spy's answer for process {pid} is not JSON") from None
    return parse(pid, threads)


def parse(pid: int, threads: object) -> Snapshot:
    """py-spy's JSON (a list of threads, innermost frame first) as a Snapshot; anything
    not of that shape is skipped."""
    stacks, local_maps, gil = [], [], []
    for thread in threads if isinstance(threads, list) else ():
        if not isinstance(thread, dict):
            continue
        frames, frame_locals = [], []
        for frame in reversed(thread.get("frames") or []):
            if not isinstance(frame, dict):
                continue
            frames.append(Frame(str(frame.get("filename", "?")), _int(frame.get("line")),
                                _function(str(frame.get("name", "?")))))
            frame_locals.append({str(v.get("name")): str(v.get("repr", ""))
                                 for v in frame.get("locals") or () if isinstance(v, dict)})
        name = str(thread.get("thread_name") or f"0x{_int(thread.get('thread_id')):x}")
        stacks.append(ThreadStack(name, name == "MainThread", tuple(frames)))
        local_maps.append(tuple(frame_locals))
        gil.append(bool(thread.get("owns_gil")))
    return Snapshot(pid, tuple(stacks), tuple(local_maps), tuple(gil))


def _function(name: str) -> str:
    """py-spy names a method ``Class.method``; Python's tracebacks, and the rest of
    distdoctor, name it ``method``."""
    return name.rsplit(".", 1)[-1] if "<locals>" not in name else name.rsplit(".", 1)[-1]


def _int(value: object) -> int:
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 0


def not_permitted(pid: int) -> str:
    """The one line for a process this user may not read, with what to do about it."""
    return (f"not permitted to read process {pid} (ptrace): run distdoctor attach as the "
            f"job's own user after 'sudo sysctl kernel.yama.ptrace_scope=0', or as root, or "
            f"in a container started with --cap-add SYS_PTRACE")


def _why(pid: int, said: str) -> str:
    """py-spy's refusal as one line, with what to do about it."""
    text = " ".join(said.split())
    if "Permission denied" in text or "Operation not permitted" in text:
        return not_permitted(pid)
    if "No such process" in text or "Failed to find process" in text:
        return f"process {pid} is gone"
    if "python" in text.lower() and ("not" in text.lower() or "fail" in text.lower()):
        return f"process {pid} is not a Python process py-spy can read ({text[:200]})"
    return f"py-spy could not read process {pid}: {text[:300]}"
