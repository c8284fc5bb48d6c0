"""The process table, read from /proc: what is alive and whose child it is."""

from __future__ import annotations

import os
import select
import signal
from pathlib import Path


def _each(name: str):
    """(pid, contents of /proc/PID/name) for every process that still has one."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                yield int(entry.name), (entry / name).read_bytes()
            except OSError:
                continue  # gone since the listing


# the suite's own long-lived children (the background lanes' runner, tests/lanes.py),
# which live across tests and are no test's to count
BACKGROUND: set[int] = set()


def children(parent: int | None = None) -> set[int]:
    """Pids of live (non-zombie) processes whose parent is ``parent`` (default: us), the
    suite's background runner apart."""
    parent = os.getpid() if parent is None else parent
    found = set()
    for pid, stat in _each("stat"):
        fields = stat.decode().rsplit(")", 1)[1].split()
        if int(fields[1]) == parent and fields[0] != "Z":
            found.add(pid)
    return found - BACKGROUND


def present(pid: int) -> bool:
    """Is ``pid`` in the process table at all, running or a zombie nobody reaped?"""
    return os.path.exists(f"/proc/{pid}")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_all_exit(pids: list[int], timeout: float) -> set[int]:
    """Block until every pid has exited (pidfds, no polling); return those still running."""
    fds = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            continue
    try:
        remaining = dict(fds)
        end = _now() + timeout
        while remaining and _now() < end:
            ready, _, _ = select.select(list(remaining), [], [], max(0.0, end - _now()))
            for fd in ready:
                remaining.pop(fd)
        return set(remaining.values())
    finally:
        for fd in fds:
            os.close(fd)


def _now() -> float:
    import time

    return time.monotonic()


def tagged(tag: str) -> set[int]:
    """Pids of live processes started with ``DISTDOCTOR_TEST_TAG=tag`` in their environment:
    a child and everything it forked, even after they were reparented to init."""
    wanted = f"DISTDOCTOR_TEST_TAG={tag}".encode()
    return {pid for pid, environ in _each("environ")
            if wanted in environ.split(b"\0") and alive(pid)}


def interruptible() -> None:
    """In the child, before exec: Ctrl-C's default disposition, as in a terminal. A suite
    started in the background (nohup, a CI runner, ``cmd &``) has SIGINT ignored, and an
    ignored signal stays ignored across exec: Python would never raise KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
