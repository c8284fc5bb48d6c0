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

from harness.collectives.transport import Pending, QueueTransport, RecvTimeout

ANSWER = (-1, (), b"")  # what a receive sends back to the sender


class SendTimeout(RecvTimeout):
    """A send waited longer than its deadline for the peer to receive it."""


class RendezvousTransport(QueueTransport):
    def __init__(self, rank: int, world_size: int, mesh, timeout: float | None = None):
        super().__init__(rank, world_size, mesh, timeout)
        self._sent = [0] * world_size  # sends posted to each peer
        self._answered = [0] * world_size  # answers received from each peer
        self._early = [deque() for _ in range(world_size)]  # data that came while waiting

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self._post(tensor, dst)
        self._sent[dst] += 1
        self._await_answer(dst, self._sent[dst])

    def isend(self, tensor: torch.Tensor, dst: int) -> Pending:
        self._post(tensor, dst)
        self._sent[dst] += 1
        return _Answer(self, dst, self._sent[dst])

    def exchange(self, tensor: torch.Tensor, dst: int, src: int,
                 into: torch.Tensor | None = None) -> torch.Tensor:
        pending = self.isend(tensor, dst)
        incoming = self.recv(src)
        pending.wait()
        return into.copy_(incoming) if into is not None else incoming

    def recv(self, src: int) -> torch.Tensor:
        end = time.monotonic() + self.timeout
        while not self._early[src]:
            message = self._get(src, end - time.monotonic(),
                                f"for data from rank {src}, which never sent it")
            if message == ANSWER:
                self._answered[src] += 1
            else:
                self._early[src].append(message)
        self.mesh[self.rank][src].put(ANSWER)
        return self._decode(self._early[src].popleft())

    def settle(self) -> None:
        """Wait for every answer still owed: each send must have been received."""
        for peer, sent in enumerate(self._sent):
            if sent > self._answered[peer]:
                self._await_answer(peer, sent)

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
    def __init__(self, transport: RendezvousTransport, dst: int, ticket: int):
        self.transport, self.dst, self.ticket = transport, dst, ticket

    def wait(self) -> None:
        self.transport._await_answer(self.dst, self.ticket)
