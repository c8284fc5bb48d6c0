"""A transport whose send completes only when the peer has received: a rendezvous.

The queue mesh buffers: a send returns at once, so a ring in which every rank sends
before it receives passes on it. On gloo (measured: any size), on NCCL with large
messages, and under MPI's synchronous send, that ring deadlocks, every rank waiting in its
send. This transport runs the same queues with an acknowledgement: a receive answers the
sender, and a blocking ``send``, an ``isend``'s ``wait``, and ``exchange``'s send half
return only once their answer has come. ``exchange`` posts its send before it receives,
as isend and irecv together would, so it cannot deadlock a ring.

Messages from one peer arrive in order, so the k-th answer from a peer is for the k-th
send to it. Data that arrives while a rank waits for an answer is kept for its next
receive, and answers that arrive while it waits for data are counted; ``settle`` waits
for the answers still owed at the end of a collective (an isend never waited on), so that
none is left on the queues for the next job.
"""

from __future__ import annotations

import time
from collections import deque

import torch

from distdoctor.collectives.transport import Pending, QueueTransport, RecvTimeout
from distdoctor.models.events import Ev

ANSWER = (-1, (), b"")  # what a receive sends back to the sender


class SendTimeout(RecvTimeout):
    """A send waited longer than its deadline for the peer to receive it."""


class RendezvousTransport(QueueTransport):
    def __init__(self, rank: int, world_size: int, mesh, timeout: float | None = None):
        super().__init__(rank, world_size, mesh, timeout)
        self._sent = [0] * world_size  # sends posted to each peer
        self._answered = [0] * world_size  # answers received from each peer
        # data that came while waiting, and (ticket, traced call) of each isend, per peer
        self._early: list[deque] = [deque() for _ in range(world_size)]
        self._owed: list[list[tuple]] = [[] for _ in range(world_size)]

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        call = self._enter("send", dst)
        self._post(tensor, dst)
        self._sent[dst] += 1
        self._await_answer(dst, self._sent[dst])
        self._mark(Ev.DONE, call)

    def isend(self, tensor: torch.Tensor, dst: int) -> Pending:
        call = self._enter("isend", dst)
        self._post(tensor, dst)
        self._sent[dst] += 1
        self._owed[dst].append((self._sent[dst], call))
        return _Answer(self, dst, self._sent[dst], call)

    def exchange(self, tensor: torch.Tensor, dst: int, src: int,
                 into: torch.Tensor | None = None) -> torch.Tensor:
        pending = self.isend(tensor, dst)
        incoming = self.recv(src)
        pending.wait()
        return into.copy_(incoming) if into is not None else incoming

    def recv(self, src: int) -> torch.Tensor:
        call = self._enter("recv", src)
        end = time.monotonic() + self.timeout
        while not self._early[src]:
            message = self._get(src, end - time.monotonic(),
                                f"for data from rank {src}, which never sent it")
            if message == ANSWER:
                self._answered[src] += 1
            else:
                self._early[src].append(message)
        self.mesh[self.rank][src].put(ANSWER)
        self._mark(Ev.DONE, call)
        return self._decode(self._early[src].popleft())

    def settle(self) -> None:
        """Wait for every answer still owed: each send must have been received."""
        for peer, owed in enumerate(self._owed):
            for ticket, call in list(owed):  # wait_for removes each from ``owed``
                self.wait_for(peer, ticket, call)

    def wait_for(self, dst: int, ticket: int, call: int | None) -> None:
        """Wait on an isend, as a Work's wait: traced, once, until its answer came."""
        if (ticket, call) not in self._owed[dst]:
            return
        self._mark(Ev.WAIT, call)
        self._await_answer(dst, ticket)
        self._mark(Ev.DONE, call)
        self._owed[dst].remove((ticket, call))

    def _await_answer(self, dst: int, ticket: int) -> None:
        end = time.monotonic() + self.timeout
        while self._answered[dst] < ticket:
            try:
                message = self._get(dst, end - time.monotonic(), "", what="send")
            except RecvTimeout:
                raise SendTimeout(f"rank {self.rank} waited {self.timeout:g} s in "
                                  f"{self.current} in send to rank {dst}, which never "
                                  f"received it") from None
            if message == ANSWER:
                self._answered[dst] += 1
            else:
                self._early[dst].append(message)


class _Answer:
    def __init__(self, transport: RendezvousTransport, dst: int, ticket: int,
                 call: int | None):
        self.transport, self.dst, self.ticket, self.call = transport, dst, ticket, call

    def wait(self) -> None:
        self.transport.wait_for(self.dst, self.ticket, self.call)
