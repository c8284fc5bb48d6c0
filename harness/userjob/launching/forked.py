"""Start a user's rank by forking the launcher, not as a fresh interpreter: the same rank,
seconds sooner.

A fresh ``python -m distdoctor.userjob`` imports torch and the tracer again (2.7 s of CPU per
rank measured here, so 5 s before a 4-rank job on 2 cores makes its first call); a fork of
the launcher, which has imported them already, takes milliseconds. What a fresh
interpreter would have differently is made fresh in the child, before the script starts:

* the environment is the rank's (torchrun's variables), in ``os.environ`` and the C one,
  and the working directory is on ``sys.path`` as ``python -m`` puts it;
* stdin, stdout and stderr are new streams on fds 0, 1 and 2 (a test runner's capture
  objects are left behind), buffered as Python buffers them, PYTHONUNBUFFERED honoured;
* every signal has Python's default disposition and no wakeup fd;
* ``random``, numpy's and torch's global generators are re-seeded from the OS, as each new
  process seeds them: forked, every rank would otherwise draw the launcher's numbers, and
  a script that never seeds would look as if its ranks agreed;
* one intra-op thread, as OMP_NUM_THREADS=1 gives a fresh rank (and as a fork needs: a
  launcher that ran a multi-threaded op leaves an OpenMP pool no child can use).

What cannot be made fresh: modules the launcher imported stay imported (their import-time
side effects happened once, in the launcher), and the hash seed of str keys is the
launcher's on every rank. So a fork is used only when it is safe (see :func:`can_fork`);
``--start-method spawn`` gives fresh interpreters, as torchrun does.
"""

from __future__ import annotations

import faulthandler
import io
import os
import random
import signal
import sys
from multiprocessing.connection import wait
from typing import Any

# Python's own dispositions at start-up: SIGINT raises KeyboardInterrupt, SIGPIPE is ignored
_PYTHON_DEFAULTS: dict[int, Any] = {signal.SIGINT: signal.default_int_handler,
                                    signal.SIGPIPE: signal.SIG_IGN}


def can_fork(env: dict[str, str]) -> str | None:
    """None when a forked rank is the same as a fresh one; else why not. CUDA, once
    initialised in the launcher, cannot be used in a forked child at all; and a child that
    asks for several intra-op threads after the launcher ran a parallel op would hang."""
    if not hasattr(os, "fork") or not hasattr(os, "pidfd_open"):
        return "this system has no fork and pidfd"
    torch = sys.modules.get("torch")
    if torch is None:
        return "torch is not imported here, so there is nothing to share"
    if torch.cuda.is_initialized():
        return "CUDA is initialised in this process, and a forked child cannot use it"
    if env.get("OMP_NUM_THREADS", "1") != "1":
        return f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']} asks for several threads per rank"
    return None


class ForkedProcess:
    """A forked child, seen as the multiprocessing.Process the watch expects."""

    def __init__(self, pid: int):
        self.pid = pid
        self.sentinel = os.pidfd_open(pid)  # readable once the child has exited
        self._code: int | None = None

    @property
    def exitcode(self) -> int | None:
        if self._code is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid:
                self._code = os.waitstatus_to_exitcode(status)  # -N: killed by signal N
        return self._code

    def is_alive(self) -> bool:
        return self.exitcode is None

    def join(self, timeout: float | None = None) -> None:
        if self.exitcode is None:
            wait([self.sentinel], timeout)
            _ = self.exitcode  # reading it reaps the child, if it has ended


def fork_rank(argv: list[str], env: dict[str, str], stdout_fd: int, stderr_fd: int,
              close: list[int]) -> ForkedProcess:
    """Fork a child that runs ``python -m distdoctor.userjob ARGV`` in this interpreter, with
    ``env`` as its environment, ``stdout_fd`` and ``stderr_fd`` as its fds 1 and 2, and
    ``close`` (fds of other ranks and of this launcher) closed."""
    pid = os.fork()
    if pid:
        return ForkedProcess(pid)
    try:  # the child: never returns, whatever happens
        os.setsid()
        os.dup2(stdout_fd, 1)
        os.dup2(stderr_fd, 2)
        for fd in [stdout_fd, stderr_fd, *close]:
            try:
                os.close(fd)
            except OSError:
                pass
        _make_fresh(env)
        from distdoctor.userjob.inrank.bootstrap import main

        main(argv)
    except BaseException:  # noqa: BLE001 (printed to the rank's stderr, which the launcher keeps)
        import traceback

        traceback.print_exc()  # to the rank's stderr, which the launcher keeps
        sys.stderr.flush()
    os._exit(1)


def _make_fresh(env: dict[str, str]) -> None:
    os.environ.clear()
    os.environ.update(env)
    if os.getcwd() not in sys.path:  # ``python -m distdoctor.userjob`` puts it first
        sys.path.insert(0, os.getcwd())
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(sig, _PYTHON_DEFAULTS.get(sig, signal.SIG_DFL))
        except (OSError, ValueError):
            pass
    # faulthandler left enabled by the launcher (pytest's plugin, python -X faulthandler)
    # would stay "enabled" in name only: its handlers were just reset above, and enabling it
    # again while it counts as enabled installs none. Off, as in a fresh interpreter; the
    # rank enables it afresh, so a fatal error (gloo's abort) still dumps the stacks.
    faulthandler.disable()
    signal.set_wakeup_fd(-1)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    encoding = env.get("PYTHONIOENCODING", "").split(":")[0] or None
    # a fresh interpreter's streams, its __std*__ too (typeshed marks those final: only
    # an interpreter sets them, and here we stand in for one)
    sys.stdin = sys.__stdin__ = _stream(0, "r", encoding, False)  # type: ignore[misc]
    sys.stdout = sys.__stdout__ = _stream(1, "w", encoding, unbuffered)  # type: ignore[misc]
    sys.stderr = sys.__stderr__ = _stream(  # type: ignore[misc]
        2, "w", encoding, unbuffered, "backslashreplace")
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    import torch

    torch.seed()
    torch.set_num_threads(1)


def _stream(fd: int, mode: str, encoding: str | None, unbuffered: bool,
            errors: str = "strict") -> io.TextIOWrapper | None:
    """A text stream on ``fd`` as Python makes one at start-up (line-buffered on a terminal
    and for stderr, block-buffered otherwise); None when the fd is closed."""
    try:
        os.fstat(fd)
    except OSError:
        return None
    writing = mode == "w"
    raw = open(fd, mode + "b", buffering=0 if writing and unbuffered else -1, closefd=False)
    return io.TextIOWrapper(raw, encoding=encoding, errors=errors,
                            line_buffering=writing and (fd == 2 or os.isatty(fd)),
                            write_through=writing and unbuffered)
