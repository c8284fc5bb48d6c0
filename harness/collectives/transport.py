"""What a collective needs from the wire: send, receive, and a non-blocking send.

Collectives are written once against :class:`Transport` and run on two: a queue mesh
between processes, and gloo point-to-point. Both count the payload bytes they move, so a
test can hold an algorithm to its formula; headers (dtype and shape) are counted apart.

Queue mesh: one ``multiprocessing.Queue`` per ordered pair of ranks. A tensor put on a
queue travels by torch's file-descriptor sharing and can be lost when the sender exits
before the receiver has read it, so the mesh carries each tensor's raw bytes instead.
``put`` returns at once (the queue's feeder thread writes), which makes ``isend`` free;
every receive has a deadline whose expiry names the rank, the peer and the collective.
"""

from __future__ import annotations

import contextlib
import os
import queue
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

import torch
import torch.distributed as dist

from distdoctor.models.events import Ev

RECV_TIMEOUT_S = float(os.environ.get("DISTDOCTOR_RECV_TIMEOUT_S", "30"))
WAIT_NOTICE_S = 0.05  # a wait this long is reported to on_wait
DTYPES = (torch.float32, torch.float64, torch.int64, torch.bfloat16, torch.int32,
          torch.float16, torch.uint8, torch.int8, torch.int16, torch.bool)
MAX_DIMS = 6


class RecvTimeout(RuntimeError):
    """A receive waited longer than its deadline: the message names who waited for whom."""


@dataclass
class TransportStats:
    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0
    header_bytes: int = 0
    steps: int = 0  # communication rounds the algorithm declared (Transport.step)


class Pending(Protocol):
    def wait(self) -> None: ...


class Transport(Protocol):
    rank: int
    world_size: int
    stats: TransportStats

    def send(self, tensor: torch.Tensor, dst: int) -> None: ...

    def recv(self, src: int) -> torch.Tensor: ...

    def isend(self, tensor: torch.Tensor, dst: int) -> Pending: ...

    def exchange(self, tensor: torch.Tensor, dst: int, src: int,
                 into: torch.Tensor | None = None) -> torch.Tensor:
        """Send ``tensor`` to ``dst`` while receiving one of the same shape and dtype from
        ``src`` (into ``into`` when given): the non-blocking pair a ring step needs, with
        no header."""

    def step(self) -> None:
        """Mark the start of a communication round (for step counts)."""

    def collective(self, name: str) -> contextlib.AbstractContextManager:
        """Name the collective in progress, for error messages."""


class _Base:
    def __init__(self, rank: int, world_size: int):
        self.rank = rank
        self.world_size = world_size
        self.stats = TransportStats()
        self.current = "a collective"

    def step(self) -> None:
        self.stats.steps += 1

    @contextlib.contextmanager
    def collective(self, name: str) -> Iterator[None]:
        previous, self.current = self.current, name
        try:
            yield
        finally:
            self.current = previous

    def _count_send(self, tensor: torch.Tensor) -> None:
        self.stats.bytes_sent += tensor.numel() * tensor.element_size()
        self.stats.messages_sent += 1

    def _count_recv(self, tensor: torch.Tensor) -> None:
        self.stats.bytes_received += tensor.numel() * tensor.element_size()
        self.stats.messages_received += 1


class _Done:
    def wait(self) -> None:
        pass


class QueueTransport(_Base):
    """A full mesh of queues: ``mesh[src][dst]`` carries what ``src`` sends to ``dst``."""

    def __init__(self, rank: int, world_size: int, mesh, timeout: float | None = None):
        super().__init__(rank, world_size)
        self.mesh = mesh
        self.timeout = RECV_TIMEOUT_S if timeout is None else timeout
        # told (what, peer) once a wait outlasts WAIT_NOTICE_S: whom this rank waits for is
        # then known outside it, even if it is stopped before its own deadline expires
        self.on_wait: Callable[[str, int], None] | None = None

    def _enter(self, op: str, peer: int) -> int | None:
        """Tell this rank's tracer of a send or receive, so the watch can prove a hang."""
        from distdoctor.trace.tracer import active

        tracer = active()
        return tracer.p2p(op, peer, tuple(range(self.world_size))) if tracer else None

    @staticmethod
    def _mark(kind: str, call_id: int | None) -> None:
        from distdoctor.trace.tracer import active

        tracer = active()
        if tracer is not None and call_id is not None:
            tracer.mark(kind, call_id)

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        call = self._enter("send", dst)
        self._post(tensor, dst)
        self._mark(Ev.DONE, call)

    def _post(self, tensor: torch.Tensor, dst: int) -> None:
        """Put ``tensor`` on the queue to ``dst``; it returns at once."""
        tensor = tensor.detach().contiguous()
        payload = tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        self.mesh[self.rank][dst].put((DTYPES.index(tensor.dtype), tuple(tensor.shape), payload))
        self._count_send(tensor)

    def isend(self, tensor: torch.Tensor, dst: int) -> Pending:
        self.send(tensor, dst)
        return _Done()

    def exchange(self, tensor: torch.Tensor, dst: int, src: int,
                 into: torch.Tensor | None = None) -> torch.Tensor:
        self.send(tensor, dst)
        incoming = self.recv(src)
        return into.copy_(incoming) if into is not None else incoming

    def flush(self) -> None:
        """Wait until everything sent is in the pipes (do this before the process exits:
        a queue's feeder thread dies with it). The mesh's pipes hold 1 MB each, so a
        receiver that reads later still gets it all."""
        for dst, q in enumerate(self.mesh[self.rank]):
            if dst != self.rank:
                q.close()
                q.join_thread()

    def recv(self, src: int) -> torch.Tensor:
        call = self._enter("recv", src)
        message = self._get(src, self.timeout, f"for data from rank {src}, which never sent it")
        self._mark(Ev.DONE, call)
        return self._decode(message)

    def _get(self, src: int, timeout: float, waiting_for: str, what: str = "recv") -> tuple:
        """The next message from ``src``; RecvTimeout, saying what was awaited, if none
        comes within ``timeout``. ``what`` ("recv", or "send" for a send awaiting its
        answer) is reported to ``on_wait`` when the wait is not over at once."""
        channel = self.mesh[src][self.rank]
        try:
            if self.on_wait is None:
                return channel.get(timeout=max(timeout, 0.0))
            try:
                return channel.get(timeout=max(min(timeout, WAIT_NOTICE_S), 0.0))
            except queue.Empty:
                self.on_wait(what, src)
                return channel.get(timeout=max(timeout - WAIT_NOTICE_S, 0.0))
        except queue.Empty:
            raise RecvTimeout(f"rank {self.rank} waited {self.timeout:g} s in {self.current} "
                              f"{waiting_for}") from None

    def _decode(self, message: tuple) -> torch.Tensor:
        code, shape, payload = message
        dtype = DTYPES[code]
        if payload:
            tensor = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(dtype)
        else:
            tensor = torch.empty(0, dtype=dtype)
        tensor = tensor.reshape(shape)
        self._count_recv(tensor)
        return tensor


class GlooTransport(_Base):
    """torch.distributed point-to-point: a fixed-size header (dtype, shape), then the data."""

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        tensor = tensor.detach().contiguous()
        dist.send(self._header(tensor), dst=dst)
        if tensor.numel():
            dist.send(tensor, dst=dst)
        self._count_send(tensor)

    def isend(self, tensor: torch.Tensor, dst: int) -> Pending:
        tensor = tensor.detach().contiguous()
        works = [dist.isend(self._header(tensor), dst=dst)]
        if tensor.numel():
            works.append(dist.isend(tensor, dst=dst))
        self._count_send(tensor)
        return _Works(works, (tensor,))

    def exchange(self, tensor: torch.Tensor, dst: int, src: int,
                 into: torch.Tensor | None = None) -> torch.Tensor:
        tensor = tensor.detach().contiguous()
        incoming = torch.empty_like(tensor) if into is None else into
        if tensor.numel():
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, dst),
                                            dist.P2POp(dist.irecv, incoming, src)])
            for work in works:
                work.wait()
        self._count_send(tensor)
        self._count_recv(incoming)
        return incoming

    def recv(self, src: int) -> torch.Tensor:
        header = torch.empty(MAX_DIMS + 2, dtype=torch.int64)
        dist.recv(header, src=src)
        self.stats.header_bytes += header.numel() * 8
        code, ndim = int(header[0]), int(header[1])
        tensor = torch.empty(tuple(header[2:2 + ndim].tolist()), dtype=DTYPES[code])
        if tensor.numel():
            dist.recv(tensor, src=src)
        self._count_recv(tensor)
        return tensor

    def _header(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() > MAX_DIMS:
            raise ValueError(f"tensors of more than {MAX_DIMS} dimensions are not supported")
        header = torch.zeros(MAX_DIMS + 2, dtype=torch.int64)
        header[0], header[1] = DTYPES.index(tensor.dtype), tensor.dim()
        header[2:2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
        self.stats.header_bytes += header.numel() * 8
        return header


@dataclass
class _Works:
    works: list
    keep: tuple  # the tensors must live until the sends complete

    def wait(self) -> None:
        for work in self.works:
            work.wait()
