"""Collectives written once, against a Transport. T is the element count, N the world
size, e the bytes per element; byte figures are payload bytes each rank sends.

Ops: sum, avg (sum, then divided by N; integer tensors divide truncating toward zero),
max, min, product. Ring algorithms cut a tensor into N chunks of c = ceil(T/N) elements,
padding the tail; padding only ever adds bytes when N does not divide T, and the docstrings
say exactly how many.
"""

from __future__ import annotations

import math

import torch

from distdoctor.collectives import OPS
from distdoctor.collectives.transport import Transport

__all__ = ["OPS", "ring_allreduce", "tree_allreduce", "broadcast", "all_gather",
           "reduce_scatter", "combine", "finish"]


def combine(a: torch.Tensor, b: torch.Tensor, op: str, out: torch.Tensor | None = None
            ) -> torch.Tensor:
    """a op b, written into ``out`` when given (the ring reduces in place)."""
    if op in ("sum", "avg"):
        return torch.add(a, b, out=out)
    if op == "max":
        return torch.maximum(a, b, out=out)
    if op == "min":
        return torch.minimum(a, b, out=out)
    if op == "product":
        return torch.mul(a, b, out=out)
    raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")


def finish(x: torch.Tensor, op: str, n: int) -> torch.Tensor:
    if op != "avg":
        return x
    if x.dtype.is_floating_point:
        return x / n
    return torch.div(x, n, rounding_mode="trunc")


def _chunks(x: torch.Tensor, n: int) -> tuple[torch.Tensor, list[torch.Tensor], int]:
    """A working copy of x padded to N*c elements, its N chunks (views), and c = ceil(T/N)."""
    flat = x.reshape(-1)
    c = math.ceil(flat.numel() / n)
    buffer = torch.empty(c * n, dtype=x.dtype)
    buffer[:flat.numel()] = flat
    buffer[flat.numel():] = 0
    return buffer, [buffer[i * c:(i + 1) * c] for i in range(n)], c


def ring_allreduce(t: Transport, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Reduce-scatter around the ring, then all-gather around it: 2(N-1) steps.

    Each rank sends one chunk per step: 2(N-1)*c*e bytes, which is 2T(N-1)/N*e when N
    divides T; otherwise padding adds 2(N-1)(N*c - T)/N*e bytes.
    """
    n, r = t.world_size, t.rank
    with t.collective("ring all-reduce"):
        if n == 1:
            return finish(x.clone(), op, 1)
        buffer, chunks, c = _chunks(x, n)
        right, left = (r + 1) % n, (r - 1) % n
        incoming = torch.empty(c, dtype=x.dtype)
        for s in range(n - 1):  # rank r ends holding the whole reduction of chunk r+1
            t.step()
            arrived = chunks[(r - s - 1) % n]
            combine(arrived, t.exchange(chunks[(r - s) % n], right, left, into=incoming), op,
                    out=arrived)
        for s in range(n - 1):  # pass the reduced chunks on until every rank has all
            t.step()
            t.exchange(chunks[(r + 1 - s) % n], right, left, into=chunks[(r - s) % n])
        return finish(buffer[:x.numel()].reshape(x.shape), op, n)


def tree_allreduce(t: Transport, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Binomial tree, any N: reduce to rank 0 in ceil(log2 N) rounds (at round k a rank
    whose bit k is its lowest set bit sends to the rank 2^k below it), then broadcast
    back down the same tree: 2*ceil(log2 N) steps.

    Bytes sent by rank r: T*e once if r > 0 (its partial result, upwards), plus T*e per
    child in the broadcast. Rank 0 sends T*ceil(log2 N)*e, the most of any rank; all ranks
    together send 2T(N-1)*e. Nothing is padded.
    """
    n, r = t.world_size, t.rank
    rounds = math.ceil(math.log2(n)) if n > 1 else 0
    with t.collective("tree all-reduce"):
        value = x.clone()
        for k in range(rounds):
            t.step()
            bit = 1 << k
            if r % (2 * bit) == bit:
                t.send(value, r - bit)
            elif r % (2 * bit) == 0 and r + bit < n:
                value = combine(value, t.recv(r + bit), op)
        for k in reversed(range(rounds)):
            t.step()
            bit = 1 << k
            if r % (2 * bit) == 0 and r + bit < n:
                t.send(value, r + bit)
            elif r % (2 * bit) == bit:
                value = t.recv(r - bit)
        return finish(value, op, n)


def broadcast(t: Transport, x: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Binomial tree rooted at ``src`` (ranks renumbered so src is 0): ceil(log2 N) steps.

    A rank sends T*e to each of its children: the root ceil(log2 N) of them,
    T*ceil(log2 N)*e; all ranks together T(N-1)*e. Non-root inputs are ignored.
    """
    n = t.world_size
    if not 0 <= src < n:
        raise ValueError(f"source rank {src} is outside world size {n}")
    v = (t.rank - src) % n
    rounds = math.ceil(math.log2(n)) if n > 1 else 0
    with t.collective(f"broadcast from rank {src}"):
        value = x.clone() if v == 0 else None  # a rank has it once its parent sent it
        for k in reversed(range(rounds)):
            t.step()
            bit = 1 << k
            if v % (2 * bit) == 0 and v + bit < n:
                assert value is not None  # the tree's order: a parent has received first
                t.send(value, (v + bit + src) % n)
            elif v % (2 * bit) == bit:
                value = t.recv((v - bit + src) % n)
        assert value is not None
        return value


def all_gather(t: Transport, x: torch.Tensor) -> list[torch.Tensor]:
    """Ring: N-1 steps, each passing one rank's whole input on. With c elements per rank
    and T = N*c in the output, each rank sends (N-1)*c*e = T(N-1)/N*e bytes; no padding.
    Inputs may differ in size between ranks; the result lists them in rank order."""
    n, r = t.world_size, t.rank
    with t.collective("all-gather"):
        blocks: list[torch.Tensor] = [x] * n  # placeholders, each replaced as it arrives
        blocks[r] = x.clone()
        right, left = (r + 1) % n, (r - 1) % n
        for s in range(n - 1):
            t.step()
            pending = t.isend(blocks[(r - s) % n], right)
            blocks[(r - s - 1) % n] = t.recv(left)
            pending.wait()
        return blocks


def reduce_scatter(t: Transport, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Ring: N-1 steps; rank r gets elements [r*c, (r+1)*c) of the reduction (the last
    ranks' shares are shorter or empty when N does not divide T), c = ceil(T/N).

    Each rank sends one chunk per step: (N-1)*c*e bytes, which is T(N-1)/N*e when N
    divides T; otherwise padding adds (N-1)(N*c - T)/N*e bytes.
    """
    n, r = t.world_size, t.rank
    with t.collective("reduce-scatter"):
        _, chunks, c = _chunks(x, n)
        right, left = (r + 1) % n, (r - 1) % n
        incoming = torch.empty(c, dtype=x.dtype)
        for s in range(n - 1):  # shifted one place, so rank r ends with chunk r
            t.step()
            arrived = chunks[(r - s - 2) % n]
            combine(arrived, t.exchange(chunks[(r - s - 1) % n], right, left, into=incoming), op,
                    out=arrived)
        mine = chunks[r][:max(0, min(c, x.numel() - r * c))]
        return finish(mine.clone(), op, n)
