"""Warm rank pools: N forked ranks with a live process group that run job after job.

Measured on a 2-core machine: a fresh 4-rank gloo group costs ~4 s when spawned and ~0.08 s
when forked; a job on a warm pool costs a few ms. So tests and the command line keep pools
warm and pay for a group only when a job broke it.

A job ends in one of three ways. Every rank returns: the pool stays warm. A rank raises or
dies: the other ranks get ``error_grace`` seconds to end by themselves (a rank that raised
exits at once, so peers blocked on it fail fast), then the stragglers' stacks are taken and
they are killed. No rank makes progress for ``deadline`` seconds: every live rank's stacks
are taken and all are killed. gloo cannot abort an operation in flight (``abort()`` and
``shutdown()`` return without unblocking it, measured on torch 2.13), and a group cannot be
re-initialised by one rank alone, so a broken generation is replaced whole: the next job
forks N new ranks that form a new group together.
"""

from __future__ import annotations

import atexit
import dataclasses
import multiprocessing as mp
import os
import signal
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable

from harness import procs, stacks
from harness.models import RankEnd
from harness.rank import rank_main

DEFAULT_DEADLINE = 30.0
DEFAULT_ERROR_GRACE = 1.0
STDERR_TAIL = 16384  # bytes of each rank's stderr kept in its end


class PoolStartError(RuntimeError):
    """The ranks could not form a process group."""


class RanksFailed(RuntimeError):
    """A job did not finish on every rank; the message is the diagnosis."""

    def __init__(self, result: "JobResult"):
        super().__init__(result.summary())
        self.result = result


@dataclass(frozen=True)
class JobResult:
    """Each rank's end, return value and streamed records for one job."""

    ends: tuple[RankEnd, ...]
    values: tuple[Any, ...]  # None where the rank did not finish
    events: tuple[tuple[Any, ...], ...]  # what each rank emitted, in order
    wall_s: float

    @property
    def ok(self) -> bool:
        return all(end.ok for end in self.ends)

    @property
    def root_cause(self) -> RankEnd | None:
        """The first rank to raise or die, not counting gloo's echoes of a peer's failure.

        A death is only noticed when the parent next looks, so a peer's "Connection reset
        by peer" can carry an earlier time than the death that caused it.
        """
        failed = [e for e in self.ends if e.status in ("raised", "died")]
        primary = [e for e in failed if not is_peer_echo(e)] or failed
        return min(primary, key=lambda e: e.at if e.at is not None else float("inf"),
                   default=None)

    def raise_for_status(self) -> "JobResult":
        if not self.ok:
            raise RanksFailed(self)
        return self

    def summary(self) -> str:
        if self.ok:
            return f"all {len(self.ends)} ranks finished in {self.wall_s:.3f} s"
        lines = []
        root = self.root_cause
        if root is not None:
            lines.append(f"rank {root.rank} {root.status} first (root cause):\n{root.error}")
        for end in self.ends:
            if end is root or end.ok:
                continue
            where = ""
            if end.stacks and end.stacks[0].frames:
                frame = end.stacks[0].frames[-1]
                where = f" in {frame.function} at {frame.file}:{frame.line}"
            lines.append(f"rank {end.rank} {end.status}{where}"
                         + (f": {end.headline}" if end.error else ""))
        return "\n".join(lines)


# What gloo raises on a rank whose peer failed: the symptom, never the cause.
_PEER_FAILURE_MESSAGES = ("Connection reset by peer", "Connection closed by peer",
                          "Broken pipe")


def is_peer_echo(end: RankEnd) -> bool:
    """Did this rank only fail because a peer went away?"""
    return end.status == "raised" and any(m in end.headline for m in _PEER_FAILURE_MESSAGES)


@dataclass
class _RankPipes:
    """Everything between the parent and one rank: jobs and results, stack requests,
    faulthandler's text, and the rank's stderr. Index 0 is the parent's end, 1 the rank's;
    the rank's ends are Connections so they survive a spawn as well as a fork."""

    conn: tuple[Connection, Connection]
    ctrl: tuple[Connection, Connection]
    faulthandler: tuple[int, Connection]
    stderr: tuple[int, Connection]

    @classmethod
    def open(cls, ctx) -> "_RankPipes":
        ends = []
        for _ in range(2):
            read, write = os.pipe()
            os.set_blocking(read, False)
            ends.append((read, Connection(write, readable=False)))
        return cls(ctx.Pipe(), ctx.Pipe(), ends[0], ends[1])

    def ends(self, side: int) -> list[Connection | int]:
        return [self.conn[side], self.ctrl[side], self.faulthandler[side], self.stderr[side]]


def _close(ends: list[Connection | int]) -> None:
    for end in ends:
        end.close() if isinstance(end, Connection) else os.close(end)


@dataclass
class _RankHandle:
    """The parent's end of one rank process."""

    rank: int
    process: BaseProcess
    conn: Connection
    ctrl: Connection
    faulthandler_fd: int
    stderr_fd: int


class RankPool:
    """N ranks with an initialised process group, kept warm across jobs."""

    def __init__(self, world_size: int, backend: str = "gloo", host: str = "127.0.0.1",
                 start_timeout: float = 60.0, start_method: str = "fork"):
        """``start_method="spawn"`` costs seconds per group (each rank imports torch) but
        is what a parent that has already initialised CUDA needs."""
        if world_size < 1:
            raise ValueError(f"world size must be at least 1, got {world_size}")
        if start_method not in ("fork", "spawn"):
            raise ValueError(f"start method must be fork or spawn, got {start_method!r}")
        self.start_method = start_method
        self.world_size = world_size
        self.backend = backend
        self.host = host
        self.start_timeout = start_timeout
        self.generations = 0  # how many times a group was formed
        self._ranks: list[_RankHandle] = []
        _live_pools.add(self)

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> "RankPool":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(r.process.pid for r in self._ranks if r.process.pid is not None)

    def start(self) -> None:
        """Fork the ranks and form the group, unless a healthy generation is up."""
        if self._ranks:
            return
        if self.start_method == "fork":
            procs.preload_heavy_modules()
        try:
            self._fork()
            self._rendezvous()
        except BaseException:
            self._teardown()
            raise
        self.generations += 1

    def close(self) -> None:
        self._teardown()
        _live_pools.discard(self)

    # -- jobs ------------------------------------------------------------------------------
    def run(self, fn: Callable[..., Any], *args: Any, deadline: float = DEFAULT_DEADLINE,
            error_grace: float = DEFAULT_ERROR_GRACE, **kwargs: Any) -> JobResult:
        """Run ``fn(ctx, *args, **kwargs)`` on every rank; never blocks past the deadline."""
        if not deadline > 0:
            raise ValueError(f"deadline must be positive, got {deadline}")
        payload = ForkingPickler.dumps(("job", fn, args, kwargs))  # fails here, not in a rank
        self.start()
        try:
            result = _Job(self._ranks, deadline, error_grace).run(payload)
        except BaseException:  # Ctrl-C, a test timeout: nothing may outlive the parent's wait
            self._teardown()
            raise
        if not result.ok:
            self._teardown()  # the group is broken; the next job forks a fresh one
        return result

    # -- internals -------------------------------------------------------------------------
    def _fork(self) -> None:
        ctx = mp.get_context(self.start_method)
        pipes = [_RankPipes.open(ctx) for _ in range(self.world_size)]
        parent_pid = os.getpid()
        try:
            for rank, own in enumerate(pipes):
                inherited = [] if self.start_method == "spawn" else (  # a fork copies them all
                    [end for other in pipes for end in other.ends(0)]
                    + [end for other in pipes if other is not own for end in other.ends(1)])
                process = ctx.Process(
                    target=rank_main, name=f"distdoctor-rank{rank}",
                    args=(rank, self.world_size, self.backend, self.host, parent_pid,
                          own.conn[1], own.ctrl[1], own.faulthandler[1], own.stderr[1],
                          inherited))
                process.start()
                self._ranks.append(_RankHandle(rank, process, own.conn[0], own.ctrl[0],
                                               own.faulthandler[0], own.stderr[0]))
        finally:
            for own in pipes:
                _close(own.ends(1))
            for own in pipes[len(self._ranks):]:  # ranks that never started
                _close(own.ends(0))

    def _rendezvous(self) -> None:
        deadline = procs.now() + self.start_timeout
        port = self._expect(self._ranks[0], "port", deadline)
        for handle in self._ranks[1:]:
            handle.conn.send(("port", port))
        for handle in self._ranks:
            self._expect(handle, "ready", deadline)

    def _expect(self, handle: _RankHandle, kind: str, deadline: float) -> Any:
        """Wait for one start-up message from a rank, failing loudly on a death or timeout."""
        waiting = [handle.conn] + [h.process.sentinel for h in self._ranks]
        while True:
            ready = wait(waiting, max(0.0, deadline - procs.now()))
            if handle.conn in ready:
                message = handle.conn.recv()
                if message[0] == kind:
                    return message[1]
                if message[0] == "raised":
                    raise PoolStartError(f"rank {handle.rank} failed to join the group:\n"
                                         f"{message[2]}")
                continue
            dead = [h for h in self._ranks if h.process.sentinel in ready]
            if dead:
                raise PoolStartError(f"rank {dead[0].rank} died while forming the group "
                                     f"({_describe_exit(dead[0].process)})")
            if not ready:
                raise PoolStartError(f"the {self.world_size} ranks did not form a "
                                     f"{self.backend} group within {self.start_timeout:.0f} s")

    def _teardown(self) -> None:
        for handle in self._ranks:
            procs.kill(handle.process)
        for handle in self._ranks:
            _close([handle.conn, handle.ctrl, handle.faulthandler_fd, handle.stderr_fd])
        self._ranks = []


class _Job:
    """The parent's side of one job: watch every rank until each has ended or been stopped."""

    def __init__(self, ranks: list[_RankHandle], deadline: float, error_grace: float):
        self.ranks = ranks
        self.deadline = deadline
        self.error_grace = error_grace
        self.ends: dict[int, RankEnd] = {}
        self.values: dict[int, Any] = {}
        self.events: dict[int, list[Any]] = {h.rank: [] for h in ranks}
        self.first_error: float | None = None
        self.started = procs.now()
        self.last_progress = {h.rank: self.started for h in ranks}
        self.stderr = {h.rank: _Tail() for h in ranks}
        for handle in ranks:
            _read_available(handle.stderr_fd)  # left over from an earlier job: not ours

    def run(self, payload: bytes) -> JobResult:
        for handle in self.ranks:
            handle.conn.send_bytes(payload)
        stderr_open = {h.stderr_fd: h.rank for h in self.ranks}
        while True:
            running = [h for h in self.ranks if h.rank not in self.ends]
            if not running:
                break
            timeout = self._time_left(running)
            watched = [h.conn for h in running] + [h.process.sentinel for h in running]
            ready = wait(watched + list(stderr_open), max(0.0, timeout)) if timeout > 0 else []
            if not ready:
                self._stop(running, "stopped" if self.first_error is not None else "hung")
                break
            for fd in set(ready) & set(stderr_open):
                if not self.stderr[stderr_open[fd]].add(_read_available(fd)):
                    del stderr_open[fd]  # the rank closed it: it has exited
            for handle in running:
                if handle.conn in ready or handle.process.sentinel in ready:
                    self._drain(handle)
        for handle in self.ranks:
            self.stderr[handle.rank].add(_read_available(handle.stderr_fd))
        return JobResult(
            ends=tuple(dataclasses.replace(self.ends[h.rank], stderr=str(self.stderr[h.rank]))
                       for h in self.ranks),
            values=tuple(self.values.get(h.rank) for h in self.ranks),
            events=tuple(tuple(self.events[h.rank]) for h in self.ranks),
            wall_s=procs.now() - self.started,
        )

    def _time_left(self, running: list[_RankHandle]) -> float:
        if self.first_error is not None:
            return self.first_error + self.error_grace - procs.now()
        latest = max(self.last_progress[h.rank] for h in running)
        return latest + self.deadline - procs.now()

    def _drain(self, handle: _RankHandle) -> None:
        """Read everything a rank has sent; notice if its process is gone."""
        rank = handle.rank
        try:
            while rank not in self.ends and handle.conn.poll():
                self._handle(rank, handle.conn.recv())
        except (EOFError, OSError):
            pass
        if rank not in self.ends and not handle.process.is_alive():
            handle.process.join()
            tail = self.stderr[rank]
            tail.add(_read_available(handle.stderr_fd))
            last_words = f"; its stderr ended with:\n{tail.last_lines(12)}" if str(tail) else ""
            self._end(RankEnd(rank, "died", at=procs.now() - self.started,
                              error=_describe_exit(handle.process) + last_words,
                              exitcode=handle.process.exitcode))

    def _handle(self, rank: int, message: tuple) -> None:
        kind, at = message[0], message[1]
        self.last_progress[rank] = procs.now()
        if kind == "event":
            self.events[rank].append(message[2])
        elif kind == "done":
            self.values[rank] = message[2]
            self._end(RankEnd(rank, "finished", at=at - self.started))
        elif kind == "raised":
            self._end(RankEnd(rank, "raised", at=at - self.started, error=message[2]))

    def _end(self, end: RankEnd) -> None:
        self.ends[end.rank] = end
        if not end.ok and self.first_error is None:
            self.first_error = procs.now()

    def _stop(self, running: list[_RankHandle], status: str) -> None:
        """Take the stacks of every rank still running, then kill them."""
        at = procs.now() - self.started
        why = (f"no rank made progress for {self.deadline:.1f} s" if status == "hung"
               else f"still running {self.error_grace:.1f} s after another rank failed")
        answers = stacks.request_stacks(
            [(h.ctrl, h.process.pid, h.faulthandler_fd) for h in running])
        for handle, (threads, raw) in zip(running, answers):
            self.ends[handle.rank] = RankEnd(handle.rank, status, at=at, error=why,
                                             stacks=threads, raw_stack=raw)
        for handle in running:
            procs.kill(handle.process)


class _Tail:
    """The last STDERR_TAIL bytes a rank wrote to stderr."""

    def __init__(self) -> None:
        self.data = b""

    def add(self, chunk: bytes | None) -> bool:
        """Keep ``chunk``; False when the writer has closed its end."""
        if chunk is None:
            return True
        self.data = (self.data + chunk)[-STDERR_TAIL:]
        return bool(chunk)

    def last_lines(self, count: int) -> str:
        return "\n".join(str(self).rstrip().splitlines()[-count:])

    def __str__(self) -> str:
        return self.data.decode(errors="replace")


def _read_available(fd: int) -> bytes | None:
    """What a non-blocking pipe holds now: b"" at end of file, None when empty."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        except OSError:
            return b"".join(chunks)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
    return b"".join(chunks) or None


def _describe_exit(process: BaseProcess) -> str:
    code = process.exitcode
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"exited with code {code} without reporting a result"


def launch(fn: Callable[..., Any], *args: Any, world_size: int, backend: str = "gloo",
           deadline: float = DEFAULT_DEADLINE, error_grace: float = DEFAULT_ERROR_GRACE,
           **kwargs: Any) -> JobResult:
    """Start ``world_size`` fresh ranks, run one job, reap them all."""
    with RankPool(world_size, backend) as pool:
        return pool.run(fn, *args, deadline=deadline, error_grace=error_grace, **kwargs)


_live_pools: "weakref.WeakSet[RankPool]" = weakref.WeakSet()
_shared: dict[tuple[int, str], RankPool] = {}


def shared_pool(world_size: int, backend: str = "gloo") -> RankPool:
    """The process-wide warm pool for this world size and backend."""
    key = (world_size, backend)
    if key not in _shared:
        _shared[key] = RankPool(world_size, backend)
    return _shared[key]


@atexit.register
def _close_all() -> None:
    for pool in list(_live_pools):
        pool.close()
