"""The inside of a rank: join the process group, then run jobs until told to stop.

A job is ``fn(ctx, *args, **kwargs)`` with a module-level ``fn``; its return value goes back
to the parent. A job that raises sends its traceback and the rank exits at once: its
closed sockets make peers blocked on it fail within milliseconds instead of waiting out
the group timeout, and the parent re-forks the whole group for the next job.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import sys
import threading
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

from distdoctor.launch import procs, stacks

# How long ranks wait for each other at rendezvous; the parent gives up sooner.
RENDEZVOUS_TIMEOUT = timedelta(seconds=120)
# torch's default group timeout: the parent's no-progress deadline always fires long before.
GROUP_TIMEOUT = timedelta(minutes=30)
# how long an exiting rank waits for its queues' feeder threads to write what it sent
FLUSH_S = 2.0


@dataclass
class RankContext:
    """Handed to every job: who this rank is, and a channel for streaming records home."""

    rank: int
    world_size: int
    backend: str
    _conn: Connection = field(repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    mesh: list | None = field(default=None, repr=False)  # queues[src][dst], with mesh pools

    def emit(self, record: Any) -> None:
        """Send a record to the parent now (it survives a later hang) and count as progress."""
        self._send(("event", procs.now(), record))

    def progress(self) -> None:
        """Tell the parent this rank is alive and moving (resets the no-progress deadline)."""
        self._send(("progress", procs.now()))

    def _send(self, message: tuple) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)  # tensors by value
        with self._lock:
            self._conn.send_bytes(data)


def rank_main(rank: int, world_size: int, backend: str, host: str, parent_pid: int,
              conn: Connection, ctrl: Connection, faulthandler_out: Connection,
              stderr_out: Connection, trace_out: Connection,
              inherited: list[Connection | int], mesh=None, evidence: bool = False) -> None:
    """Entry point of a rank process. Never returns into the parent's code."""
    code = 1
    try:
        procs.become_rank(parent_pid)
        for other in inherited:  # every other pipe end a fork copied: not ours
            other.close() if isinstance(other, Connection) else os.close(other)
        os.dup2(stderr_out.fileno(), 2)  # warnings and last words go to the parent, per rank
        stderr_out.close()
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # not the parent's (captured) one
        faulthandler.enable(sys.stderr, all_threads=True)  # a fatal signal's stack, too
        faulthandler_fd = os.dup(faulthandler_out.fileno())
        faulthandler_out.close()
        stacks.arm_faulthandler(faulthandler_fd)
        from distdoctor.trace.tracer import Tracer

        tracer = Tracer(os.dup(trace_out.fileno()), rank).install()  # before any first call
        trace_out.close()
        if evidence:  # what distdoctor run records of a user's script
            from distdoctor.trace.recorders import install_recorders

            tracer.record_ddp_parameters()
            install_recorders(tracer)
        stacks.serve_stacks(ctrl)
        ctx = RankContext(rank, world_size, backend, conn, mesh=mesh)
        _join_group(ctx, host)
        conn.send(("ready", procs.now()))
        code = _serve_jobs(ctx, conn, tracer)
    except KeyboardInterrupt:
        pass  # stopped on purpose
    # The rank tells its parent what went wrong, whatever it is; e.g. the group could not form: tell
    # the parent why.
    except BaseException:  # noqa: BLE001
        try:
            conn.send(("raised", procs.now(), traceback.format_exc()))
        except BaseException:  # noqa: BLE001, S110 (the parent is gone: nobody is left to tell)
            pass  # the parent is gone; nobody is left to tell
    finally:
        _flush_sent(mesh[rank] if mesh else [])
        os._exit(code)  # no atexit, no destructors: torch's can deadlock at teardown


def _flush_sent(queues: list, within: float = FLUSH_S) -> None:
    """Write out what this rank put on its queues before it exits. A queue's put only hands
    the message to a feeder thread, and os._exit drops what that thread has not yet written:
    a rank that received (and so answered its sender) and then raised could take the answer
    with it, and its peer waited on a send that had in fact been received (seen as a rare
    "hang" in check-collective). Bounded: a peer that never reads may leave a pipe full."""
    if not queues:
        return
    for q in queues:
        q.close()  # no more puts: the feeder writes what it holds, then ends

    def join() -> None:
        for q in queues:
            q.join_thread()

    flusher = threading.Thread(target=join, daemon=True)
    flusher.start()
    flusher.join(within)


def _join_group(ctx: RankContext, host: str) -> None:
    import torch.distributed as dist

    from distdoctor.launch.store import is_loopback, master_store, pin_gloo_to_loopback

    if is_loopback(host):
        pin_gloo_to_loopback()
    if ctx.rank == 0:  # the OS picks a free port: no races between concurrent pools
        store = master_store(ctx.world_size, RENDEZVOUS_TIMEOUT, host)
        ctx._send(("port", store.port))
    else:
        kind, port = ctx._conn.recv()
        assert kind == "port", kind
        store = dist.TCPStore(host, port, ctx.world_size, is_master=False,
                              timeout=RENDEZVOUS_TIMEOUT)
    if ctx.backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("backend nccl needs a CUDA GPU per rank and this machine has "
                               "none; use the gloo backend")
        torch.cuda.set_device(ctx.rank % torch.cuda.device_count())
    dist.init_process_group(ctx.backend, store=store, rank=ctx.rank,
                            world_size=ctx.world_size, timeout=GROUP_TIMEOUT)


def _serve_jobs(ctx: RankContext, conn: Connection, tracer) -> int:
    from distdoctor.trace import jobend

    while True:
        message = conn.recv()
        if message[0] == "close":
            return 0
        _, fn, args, kwargs = message
        tracer.reset()  # a job's calls are numbered from its own start, on every rank
        ctx.progress()
        try:
            value = fn(ctx, *args, **kwargs)
        # The user's job may raise anything: sent to the parent as its traceback.
        except BaseException:  # noqa: BLE001
            ctx._send(("raised", procs.now(), traceback.format_exc()))
            return 1
        jobend.job_ended(tracer)
        try:
            ctx._send(("done", procs.now(), value))
        # An unpicklable result raises anything: sent to the parent as a traceback.
        except Exception:  # noqa: BLE001
            ctx._send(("raised", procs.now(),
                       traceback.format_exc() + "\nthe job's return value could not be sent"))
            return 1
