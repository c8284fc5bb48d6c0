"""Process plumbing for ranks: why fork, how a rank cuts loose, how it is made to go away.

Ranks are forked from the parent, not spawned. Measured on a 2-core machine with torch 2.13:
a spawned 4-rank gloo group costs about 4 s (each child re-imports torch), a fork from a
parent that has already imported torch costs about 0.08 s. Two fork hazards are handled:

* A parent that already ran a multi-threaded torch op leaves an OpenMP pool the child cannot
  use, and the child hangs at its first matmul. Every rank sets one intra-op thread before
  any op (what torchrun's OMP_NUM_THREADS=1 does for the same reason).
* The first DDP, FSDP or pipelining call lazily imports ~800 modules (torch._dynamo, sympy,
  ...), seconds per rank. The parent imports them once before the first fork, so every
  rank inherits them for free.

Every rank gets its own process group (so a terminal's Ctrl-C reaches only the parent,
which then stops the ranks in order) and a parent-death signal (so a parent killed with
SIGKILL or an unhandled SIGTERM takes its ranks with it).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from multiprocessing.process import BaseProcess
from typing import Callable

_PR_SET_PDEATHSIG = 1
_HEAVY_MODULES = (
    "numpy",
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "torch._dynamo",
    "torch.distributed.algorithms.join",
    "torch.distributed.algorithms.ddp_comm_hooks.default_hooks",
    "torch.distributed.fsdp",
    "torch.distributed.optim",
    "torch.distributed.pipelining",
    "torch.distributed.tensor",
)
_preloaded = False


def preload_heavy_modules() -> None:
    """Import, once in the parent, what every rank would otherwise import lazily itself."""
    global _preloaded
    if _preloaded:
        return
    import importlib
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in _HEAVY_MODULES:
            importlib.import_module(name)
    _preloaded = True


def become_rank(parent_pid: int, set_threads: bool = True) -> None:
    """First thing in a fresh rank, before any torch op. A rank that runs a user's script
    keeps the script's own thread settings (the launcher sets OMP_NUM_THREADS, as torchrun
    does)."""
    try:
        os.setpgid(0, 0)
    except PermissionError:
        pass  # already leading its own session
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before the death signal was armed
        os._exit(1)
    for sig in (signal.SIGTERM, signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if set_threads:
        import torch

        torch.set_num_threads(1)


# a process SIGKILLed dies once the kernel has freed it: well under a second here, yet a
# rank of a few hundred MB on cores a CPU hog holds once took over 2 s, and was left
# behind unreaped. The wait ends as soon as it is gone; only a process stuck in the kernel
# (a hung filesystem) would take the whole of it
REAP_S = 30.0


def kill(processes: list[BaseProcess], timeout: float = REAP_S) -> None:
    """SIGKILL ranks and everything they started, all at once (so none outlives another
    long enough to see its peers' sockets close), then reap them."""
    signal_kill(processes)
    for process in processes:
        if process.pid is not None:
            process.join(timeout)


def signal_kill(processes: list[BaseProcess]) -> None:
    """SIGKILL each process's group and the process itself; reaping is the caller's."""
    for process in processes:
        pid = process.pid
        if pid is None:
            continue
        for target in (lambda: os.killpg(pid, signal.SIGKILL),
                       lambda: os.kill(pid, signal.SIGKILL)):
            try:
                target()
            except (ProcessLookupError, PermissionError):
                pass


def reap_in_background(processes: list[BaseProcess], then: Callable[[], None],
                       timeout: float = REAP_S) -> threading.Thread:
    """SIGKILL the processes now; reap them, then call ``then`` (close their pipes), on a
    thread of its own. The kernel takes a while to free a killed rank's memory (0.2 s for
    32 ranks here), and a report need not wait for it. Not a daemon: the interpreter
    reaps them before it exits, whatever happens meanwhile."""
    signal_kill(processes)

    def reap() -> None:
        try:
            for process in processes:
                if process.pid is not None:
                    process.join(timeout)
        finally:
            then()

    thread = threading.Thread(target=reap, name="distdoctor-reap")
    thread.start()
    _reaping.append(thread)
    return thread


_reaping: list[threading.Thread] = []


def wait_reaped() -> None:
    """Return once every process handed to reap_in_background is reaped: what a command
    calls before it returns, so it leaves no child behind."""
    while _reaping:
        _reaping.pop().join()


def now() -> float:
    """A clock every process on the machine shares, to order events across ranks."""
    return time.monotonic()


_F_SETPIPE_SZ = 1031  # Linux


def trace_pipe() -> tuple[int, int]:
    """A pipe for a rank's call trace: non-blocking to read, and as large as the system
    allows (1 MB here), so a rank never waits on the parent to write a line."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    enlarge_pipe(write)
    return read, write


def enlarge_pipe(fd: int, size: int = 1 << 20) -> None:
    """Grow a pipe's buffer (Linux; a no-op where the system refuses)."""
    import fcntl

    try:
        fcntl.fcntl(fd, _F_SETPIPE_SZ, size)
    except OSError:
        pass
