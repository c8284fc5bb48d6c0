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
import multiprocessing as mp
import os
import pickle
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

from distdoctor.launch import procs
from distdoctor.launch.rank import rank_main
from distdoctor.launch.results import JobResult
from distdoctor.launch.watch import JobWatch, RankHandle, describe_exit
from distdoctor.models import deadlines

DEFAULT_DEADLINE = deadlines.WORKLOAD_S
DEFAULT_ERROR_GRACE = 1.0
CLOSE_GRACE = 1.0  # seconds idle ranks get to leave when their pool closes


class PoolStartError(RuntimeError):
    """The ranks could not form a process group."""


@dataclass
class _RankPipes:
    """Everything between the parent and one rank: jobs and results, stack requests,
    faulthandler's text, the rank's stderr and its call trace. Index 0 is the parent's end,
    1 the rank's;
    the rank's ends are Connections so they survive a spawn as well as a fork."""

    conn: tuple[Connection, Connection]
    ctrl: tuple[Connection, Connection]
    faulthandler: tuple[int, Connection]
    stderr: tuple[int, Connection]
    trace: tuple[int, Connection]

    @classmethod
    def open(cls, ctx) -> _RankPipes:
        ends = []
        for make in (os.pipe, os.pipe, procs.trace_pipe):
            read, write = make()
            os.set_blocking(read, False)
            ends.append((read, Connection(write, readable=False)))
        return cls(ctx.Pipe(), ctx.Pipe(), *ends)

    def ends(self, side: int) -> list[Connection | int]:
        return [self.conn[side], self.ctrl[side], self.faulthandler[side], self.stderr[side],
                self.trace[side]]


def _queue(ctx):
    """A queue whose pipe holds 1 MB, so what a rank sent survives its exit unread."""
    q = ctx.Queue()
    procs.enlarge_pipe(q._writer.fileno())
    return q


def _close(ends: list[Connection | int]) -> None:
    for end in ends:
        end.close() if isinstance(end, Connection) else os.close(end)



class RankPool:
    """N ranks with an initialised process group, kept warm across jobs."""

    def __init__(self, world_size: int, backend: str = "gloo", host: str = "127.0.0.1",
                 start_timeout: float = 60.0, start_method: str = "fork", mesh: bool = False,
                 evidence: bool = False):
        """``start_method="spawn"`` costs seconds per group (each rank imports torch) but
        is what a parent that has already initialised CUDA needs. ``mesh`` gives each
        generation a full mesh of queues between its ranks (``ctx.mesh[src][dst]``), for
        collectives that bring their own transport. ``evidence``: the ranks record what
        ``distdoctor run`` records of a user's script (gradients, batches, DDP's
        parameters), for jobs whose traces the silent-bug detectors read."""
        if world_size < 1:
            raise ValueError(f"world size must be at least 1, got {world_size}")
        if start_method not in ("fork", "spawn"):
            raise ValueError(f"start method must be fork or spawn, got {start_method!r}")
        self.start_method = start_method
        self.mesh = mesh
        self.evidence = evidence
        self.world_size = world_size
        self.backend = backend
        self.host = host
        self.start_timeout = start_timeout
        self.generations = 0  # how many times a group was formed
        self.forked: list[int] = []  # every rank pid of every generation, to check reaping
        self._ranks: list[RankHandle] = []
        _live_pools.add(self)

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> RankPool:
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
        """Ask a healthy generation's ranks to leave (each exits by itself, as a finished
        process does: its exit handlers run, a coverage tool's among them), then reap
        whatever is left the hard way."""
        for handle in self._ranks:
            try:
                handle.conn.send(("close",))
            except OSError:
                pass
        left, end = [h.process.sentinel for h in self._ranks], procs.now() + CLOSE_GRACE
        while left and procs.now() < end:
            ready = wait(left, max(0.0, end - procs.now()))
            left = [s for s in left if s not in ready]
        self._teardown()
        _live_pools.discard(self)

    def reset(self) -> None:
        """Stop this generation (its group is unusable, or stale); the next job forks a
        new one."""
        self._teardown()

    # -- jobs ------------------------------------------------------------------------------
    def run(self, fn: Callable[..., Any], *args: Any, deadline: float = DEFAULT_DEADLINE,
            error_grace: float = DEFAULT_ERROR_GRACE, limit: float | None = None,
            **kwargs: Any) -> JobResult:
        """Run ``fn(ctx, *args, **kwargs)`` on every rank; never blocks past the deadline
        (seconds without progress) or ``limit`` (seconds in all, when given)."""
        if not deadline > 0:
            raise ValueError(f"deadline must be positive, got {deadline}")
        # plain pickle: tensors travel by value. ForkingPickler would share their storage
        # by file descriptor, which one rank can claim and the others then cannot.
        payload = pickle.dumps(("job", fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        self.start()
        try:
            result = JobWatch(self._ranks, deadline, error_grace, limit=limit).run(payload)
        except BaseException:  # Ctrl-C, a test timeout: nothing may outlive the parent's wait
            self._teardown()
            raise
        if not result.ok:
            self._teardown()  # the group is broken; the next job forks a fresh one
        return result

    # -- internals -------------------------------------------------------------------------
    def _fork(self) -> None:
        ctx: Any = mp.get_context(self.start_method)  # fork, forkserver or spawn
        pipes = [_RankPipes.open(ctx) for _ in range(self.world_size)]
        n = self.world_size
        self._queues = [[_queue(ctx) for _ in range(n)] for _ in range(n)] if self.mesh else None
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
                          own.trace[1], inherited, self._queues, self.evidence))
                process.start()
                self.forked.append(process.pid)
                self._ranks.append(RankHandle(rank, process, own.conn[0], own.ctrl[0],
                                               own.faulthandler[0], own.stderr[0],
                                               own.trace[0]))
        finally:
            for own in pipes:
                _close(own.ends(1))
            for own in pipes[len(self._ranks):]:  # ranks that never started
                _close(own.ends(0))

    def _rendezvous(self) -> None:
        deadline = procs.now() + self.start_timeout
        port = self._expect(self._ranks[0], "port", deadline)
        for handle in self._ranks[1:]:
            try:
                handle.conn.send(("port", port))
            except OSError:  # it died before it could read: say so, as _expect does
                handle.process.join(1.0)
                raise PoolStartError(f"rank {handle.rank} died while forming the group "
                                     f"({describe_exit(handle.process)})") from None
        for handle in self._ranks:
            self._expect(handle, "ready", deadline)

    def _expect(self, handle: RankHandle, kind: str, deadline: float) -> Any:
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
            if dead:  # its sentinel closes as it exits, a moment before it can be reaped
                dead[0].process.join(1.0)
                raise PoolStartError(f"rank {dead[0].rank} died while forming the group "
                                     f"({describe_exit(dead[0].process)})")
            if not ready:
                raise PoolStartError(f"the {self.world_size} ranks did not form a "
                                     f"{self.backend} group within {self.start_timeout:.0f} s")

    def _teardown(self) -> None:
        procs.kill([handle.process for handle in self._ranks])
        for row in getattr(self, "_queues", None) or ():
            for q in row:
                q.close()
        self._queues = None
        for handle in self._ranks:
            _close([handle.conn, handle.ctrl, handle.faulthandler_fd, handle.stderr_fd,
                    handle.trace_fd])
        self._ranks = []


def launch(fn: Callable[..., Any], *args: Any, world_size: int, backend: str = "gloo",
           deadline: float = DEFAULT_DEADLINE, error_grace: float = DEFAULT_ERROR_GRACE,
           **kwargs: Any) -> JobResult:
    """Start ``world_size`` fresh ranks, run one job, reap them all."""
    with RankPool(world_size, backend) as pool:
        return pool.run(fn, *args, deadline=deadline, error_grace=error_grace, **kwargs)


_live_pools: weakref.WeakSet[RankPool] = weakref.WeakSet()
_shared: dict[tuple[int, str, bool, bool], RankPool] = {}


def shared_pool(world_size: int, backend: str = "gloo", mesh: bool = False,
                evidence: bool = False) -> RankPool:
    """The process-wide warm pool for this world size and backend (and queue mesh, and
    evidence recorders)."""
    key = (world_size, backend, mesh, evidence)
    if key not in _shared:
        _shared[key] = RankPool(world_size, backend, mesh=mesh, evidence=evidence)
    return _shared[key]


@atexit.register
def _close_all() -> None:
    for pool in list(_live_pools):
        pool.close()
