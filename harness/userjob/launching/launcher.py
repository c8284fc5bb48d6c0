"""``distdoctor run``: start a user's script on N ranks as ``torchrun --standalone`` would.

Each rank runs ``python -m distdoctor.userjob SCRIPT ARGS`` with the environment torchrun gives
its workers (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, OMP_NUM_THREADS=1). As torchrun's agent does, this process hosts the TCP store
(on loopback only, unless ``--master-addr`` names another address, and on a port the OS
picks, so no races) and sets TORCHELASTIC_USE_AGENT_STORE, so the script's
own ``init_process_group`` connects to it. The ranks are then watched like a pool's job:
calls as they happen, stdout and stderr passed on as whole lines (``output.py``) and
stderr kept, stacks of ranks that stop, all killed
and reaped at the end.

A rank is a fork of this process where that is the same as a fresh interpreter (see
``forked.py``: seconds sooner per rank), else a fresh ``python -m distdoctor.userjob``, as
torchrun starts one; ``start_method`` chooses ("auto", "fork", "spawn").
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import cast

from distdoctor.launch import procs
from distdoctor.launch.results import JobResult
from distdoctor.launch.store import LOOPBACK, is_loopback, master_store, pin_gloo_to_loopback
from distdoctor.launch.watch import JobWatch, RankHandle
from distdoctor.models import deadlines
from distdoctor.userjob.launching.forked import ForkedProcess, can_fork, fork_rank
from distdoctor.userjob.launching.output import OutputSpec, RankOutput

STORE_TIMEOUT = timedelta(seconds=300)  # torch's default for a TCPStore


class ScriptStartError(RuntimeError):
    """The ranks did not come up (a rank died on start, or the start took too long)."""


@dataclass
class PopenProcess:
    """A subprocess.Popen seen as the multiprocessing.Process the watch expects."""

    popen: subprocess.Popen
    sentinel: int  # a pidfd: readable once the process has exited

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass


def rank_environment(rank: int, world_size: int, port: int,
                     host: str = LOOPBACK, nodes: int = 1) -> dict[str, str]:
    """What torchrun gives a worker; with ``nodes``, as ``torchrun --nnodes`` numbers the
    ranks of that many nodes of ``world_size // nodes`` ranks each (all on this machine: a
    course's two-node lesson, graded on one)."""
    per_node = world_size // nodes
    env = dict(os.environ)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank % per_node), WORLD_SIZE=str(world_size),
               LOCAL_WORLD_SIZE=str(per_node), GROUP_RANK=str(rank // per_node),
               ROLE_RANK=str(rank),
               ROLE_WORLD_SIZE=str(world_size), MASTER_ADDR=host,
               MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True",
               DISTDOCTOR_PARENT_PID=str(os.getpid()))
    env.setdefault("OMP_NUM_THREADS", "1")
    if is_loopback(host):
        pin_gloo_to_loopback(env)
    return env


def run_script(script: str, args: list[str], world_size: int, deadline: float,
               error_grace: float = 1.0, echo: bool = True, host: str = LOOPBACK,
               port: int = 0, light: bool = False, start_method: str = "auto",
               output: OutputSpec = OutputSpec(), nodes: int = 1) -> JobResult:
    """Run the script on ``world_size`` ranks until every rank ended or was stopped; the
    store listens on ``host:port`` alone (default: loopback, a port the OS picks).
    ``echo``: pass the ranks' stdout and stderr on, whole lines as ``output`` says.
    ``light``: trace calls only, not the evidence of the silent bugs. ``start_method``:
    "fork" (refused where a fork would not be a fresh rank), "spawn", or "auto" (fork
    where it is safe). ``nodes``: number the ranks as that many nodes' (rank_environment)."""
    if start_method not in ("auto", "fork", "spawn"):
        raise ValueError(f"start method must be auto, fork or spawn, got {start_method!r}")
    if nodes < 1 or world_size % nodes:
        raise ValueError(f"{world_size} ranks do not make {nodes} nodes of as many each")
    store = master_store(world_size, STORE_TIMEOUT, host, port)
    handles: list[RankHandle] = []
    lines = RankOutput(output)
    try:
        for rank in range(world_size):
            env = rank_environment(rank, world_size, store.port, host, nodes)
            why_not = can_fork(env)
            if start_method == "fork" and why_not:
                raise ScriptStartError(f"cannot fork the ranks: {why_not}")
            fork = start_method != "spawn" and why_not is None
            handles.append(_start(rank, env, script, args, light, fork, handles))
        _wait_until_ready(handles)
        watch = JobWatch(handles, deadline, error_grace, lines.feed if echo else None,
                         exit_zero_finishes=True)
        return watch.run(b"go")
    finally:
        procs.signal_kill([h.process for h in handles])
        lines.close()
        for h in handles:
            h.conn.close()
            h.ctrl.close()
        # the report need not wait for the kernel to free 32 killed ranks' memory
        procs.reap_in_background([h.process for h in handles], lambda: _close_fds(handles))
        del store


def _close_fds(handles: list[RankHandle]) -> None:
    """Close what is left of the ranks' pipes, once they are reaped (the sentinel is how a
    rank's end is waited for)."""
    for h in handles:
        for fd in (h.faulthandler_fd, h.stderr_fd, h.stdout_fd, h.trace_fd,
                   h.process.sentinel):
            if fd is not None:
                os.close(fd)


def _start(rank: int, env: dict[str, str], script: str, args: list[str], light: bool,
           fork: bool, earlier: list[RankHandle]) -> RankHandle:
    conn_parent, conn_child = mp.Pipe()
    ctrl_parent, ctrl_child = mp.Pipe()
    pipes = [os.pipe(), os.pipe(), os.pipe(), procs.trace_pipe()]  # faulthandler, stderr,
    for read, _ in pipes:  # stdout, trace
        os.set_blocking(read, False)
    (fh_read, fh_write), (err_read, err_write), (out_read, out_write), \
        (trace_read, trace_write) = pipes
    fds = [conn_child.fileno(), ctrl_child.fileno(), fh_write, trace_write]
    argv = ["--fds", ",".join(map(str, fds)), *(["--light"] if light else []), script, *args]
    process: ForkedProcess | PopenProcess
    try:
        if fork:  # the child closes this rank's parent ends and every earlier rank's
            theirs = [fd for h in earlier for fd in (h.conn.fileno(), h.ctrl.fileno(),
                                                    h.faulthandler_fd, h.stderr_fd,
                                                    h.stdout_fd, h.trace_fd,
                                                    h.process.sentinel) if fd is not None]
            process = fork_rank(argv, env, out_write, err_write, theirs + [
                conn_parent.fileno(), ctrl_parent.fileno(), fh_read, err_read, out_read,
                trace_read])
        else:
            popen = subprocess.Popen([sys.executable, "-m", "distdoctor.userjob", *argv], env=env,
                                     pass_fds=fds, stdout=out_write, stderr=err_write,
                                     start_new_session=True)
            process = PopenProcess(popen, os.pidfd_open(popen.pid))
    finally:
        for end in (conn_child, ctrl_child):
            end.close()
        for fd in (fh_write, err_write, out_write, trace_write):
            os.close(fd)
    return RankHandle(rank, process, conn_parent, ctrl_parent, fh_read, err_read, trace_read,
                      stdout_fd=out_read)


def _wait_until_ready(handles: list[RankHandle]) -> None:
    waiting = {h.conn: h for h in handles}
    end = procs.now() + deadlines.START_S
    while waiting:
        sentinels = {h.process.sentinel: h for h in waiting.values()}
        ready = wait(list(waiting) + list(sentinels), max(0.0, end - procs.now()))
        if not ready:
            raise ScriptStartError(f"ranks {sorted(h.rank for h in waiting.values())} did not "
                                   f"start within {deadlines.START_S:.0f} s")
        for item in ready:
            if item in sentinels:
                handle = sentinels[item]
                tail = _read_all(handle.stderr_fd)
                raise ScriptStartError(f"rank {handle.rank} exited while starting "
                                       f"(code {handle.process.exitcode}): {tail[-2000:]}")
            waiting.pop(cast(Connection, item)).conn.recv()


def _read_all(fd: int) -> str:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


__all__ = ["run_script", "ScriptStartError", "Connection"]
