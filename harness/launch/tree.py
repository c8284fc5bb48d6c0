"""A command's whole process tree, found through /proc, stopped and reaped.

``distdoctor run -- COMMAND`` starts a launcher it does not know (torchrun, ``mp.spawn``, a
shell loop) whose ranks may start their own children (DataLoader workers) or leave their
parent. While the command runs, this process is a child subreaper (Linux), so any of them
orphaned on the way is re-parented to it, not to init: every one stays findable by
walking the parent links down from here. Only those are stopped and reaped, by pid:
distdoctor may run inside a process with children of its own (the pytest plugin's warm
ranks), which are never touched. ``attach`` reads the same links of a job it did not
start, only to find its processes.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from pathlib import Path
from typing import Callable

_PR_SET_CHILD_SUBREAPER = 36


def subreaper(on: bool) -> bool:
    """Orphaned descendants come to this process while ``on`` (Linux 3.4+); False where
    refused."""
    if not sys.platform.startswith("linux"):
        return False
    return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, int(on)) == 0


def parents() -> dict[int, int]:
    """Every visible process's parent pid, by pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and fields[1].isdigit():
            found[int(entry.name)] = int(fields[1])
    return found


def descendants(root: int, links: dict[int, int] | None = None) -> list[int]:
    """``root``'s children, theirs, and so on, parents before children."""
    links = parents() if links is None else links
    children: dict[int, list[int]] = {}
    for pid, parent in links.items():
        children.setdefault(parent, []).append(pid)
    order, todo = [], sorted(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        order.append(pid)
        todo.extend(sorted(children.get(pid, [])))
    return order


def kill_all(members: Callable[[], list[int]], grace: float = 0.0) -> None:
    """SIGTERM then, after ``grace`` seconds, SIGKILL (at once when ``grace`` is 0) every
    process ``members()`` lists, asked again each round (a process forking as it is
    killed). Reaping is the caller's."""
    if grace > 0:
        _signal(members(), signal.SIGTERM)
        end = time.monotonic() + grace
        while time.monotonic() < end and alive(members()):
            time.sleep(0.05)
    for _ in range(5):
        running = [pid for pid in members() if alive([pid])]
        if not running:
            break
        _signal(running, signal.SIGKILL)
        time.sleep(0.02)


def reap(pids: list[int], block_for: float = 0.0) -> None:
    """Reap those of ``pids`` that are this process's children once they end, waiting up
    to ``block_for`` seconds for them."""
    end = time.monotonic() + block_for
    waiting = set(pids)
    while waiting:
        for pid in list(waiting):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid  # not ours (re-parented elsewhere), or reaped already
            if done:
                waiting.discard(pid)
        if not waiting or time.monotonic() >= end:
            return
        time.sleep(0.01)


def alive(pids: list[int]) -> bool:
    """Is any of ``pids`` running (not ended, not a zombie)?"""
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if stat[stat.rfind(")") + 2:].split()[0] != "Z":
                return True
        except (OSError, IndexError):
            pass
    return False


def _signal(pids: list[int], sig: int) -> None:
    for pid in dict.fromkeys(pids):
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
