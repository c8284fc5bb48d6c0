"""User-style collectives for check-collective: correct ones and deliberately broken ones.

Each takes distdoctor's transport (rank, world_size, send, recv, isend) and the rank's
tensor (and the source rank for broadcast) and returns the result, as a student would
write them: a ring that passes chunks to the right.
"""

import torch


def _ring(t, x, reduce_steps, first_chunk=0, divide=False):
    n, r = t.world_size, t.rank
    flat = x.reshape(-1).clone()
    size = -(-flat.numel() // n) if flat.numel() else 0
    chunks = [flat[i * size:(i + 1) * size].clone() for i in range(n)]
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(reduce_steps(n)):
        pending = t.isend(chunks[(r - s + first_chunk) % n], right)  # CHUNK-LINE
        chunks[(r - s - 1) % n] = chunks[(r - s - 1) % n] + t.recv(left)
        pending.wait()
    for s in range(n - 1):
        pending = t.isend(chunks[(r + 1 - s) % n], right)
        chunks[(r - s) % n] = t.recv(left)
        pending.wait()
    out = torch.cat(chunks)[:flat.numel()].reshape(x.shape)  # RESHAPE-LINE
    if not divide:
        return out
    return out / n if out.is_floating_point() else torch.div(out, n, rounding_mode="trunc")


def ring_allreduce(t, x):
    return _ring(t, x, lambda n: n - 1)


def ring_allreduce_send_first(t, x):
    """The same ring with a blocking send before each receive: correct on a wire that
    buffers, a deadlock on one where a send waits for its receive."""
    n, r = t.world_size, t.rank
    flat = x.reshape(-1).clone()
    size = -(-flat.numel() // n) if flat.numel() else 0
    chunks = [flat[i * size:(i + 1) * size].clone() for i in range(n)]
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        t.send(chunks[(r - s) % n], right)  # SEND-FIRST-LINE
        chunks[(r - s - 1) % n] = chunks[(r - s - 1) % n] + t.recv(left)
    for s in range(n - 1):
        t.send(chunks[(r + 1 - s) % n], right)
        chunks[(r - s) % n] = t.recv(left)
    return torch.cat(chunks)[:flat.numel()].reshape(x.shape)


def ring_avg(t, x):
    return _ring(t, x, lambda n: n - 1, divide=True)


def ring_avg_without_division(t, x):
    return _ring(t, x, lambda n: n - 1)  # BUG: sums, never divides by the world size


def ring_wrong_chunk_index(t, x):
    return _ring(t, x, lambda n: n - 1, first_chunk=1)  # BUG: sends the chunk one ahead


def ring_off_by_one(t, x):
    return _ring(t, x, lambda n: n - 2)  # BUG: one reduce step short


def broadcast(t, x, src):
    if t.rank == src:
        for peer in range(t.world_size):
            if peer != src:
                t.send(x, peer)
        return x
    return t.recv(src)


def broadcast_from_zero_only(t, x, src):
    if t.rank == 0:  # BUG: assumes the source is rank 0
        for peer in range(1, t.world_size):
            t.send(x, peer)
        return x
    return t.recv(0)


def tree_broadcast_spins_off_root0(t, x, src):  # SPIN-START
    """A binomial-tree broadcast whose span only doubles for source 0: from any other
    source every rank loops forever without a send or a receive."""
    n, r = t.world_size, t.rank
    span = 1
    while span < n:
        if src == 0 and r < span and r + span < n:
            t.send(x, r + span)
        elif src == 0 and span <= r < 2 * span:
            x = t.recv(r - span)
        if src == 0:  # BUG: the loop's progress depends on the source being rank 0
            span *= 2
    return x  # SPIN-END


def tree_broadcast_bigint_spin(t, x, src):  # BIGINT-START
    """Seed lesson 76's shape: ranks learn the value as a tree spreads it from rank 0, and
    the loop waits until every rank is known to hold it; from another source nobody ever
    sends, and each rank spins on a growing big-int shift (a bitmask of who holds it)."""
    n, r = t.world_size, t.rank
    has_value = {0}
    seen = 1
    while len(has_value) < n:
        seen = seen << 1  # grows without end: each shift longer than the last
        if src == 0:
            for holder in sorted(has_value):
                peer = holder + len(has_value)
                if peer < n:
                    if r == holder:
                        t.send(x, peer)
                    elif r == peer:
                        x = t.recv(holder)
            has_value |= {h + len(has_value) for h in has_value if h + len(has_value) < n}
    return x  # BIGINT-END


def allgather(t, x):
    n, r = t.world_size, t.rank
    blocks = [None] * n
    blocks[r] = x
    for s in range(n - 1):
        pending = t.isend(blocks[(r - s) % n], (r + 1) % n)
        blocks[(r - s - 1) % n] = t.recv((r - 1) % n)
        pending.wait()
    return blocks


def allgather_rank0_never_sends(t, x):
    n, r = t.world_size, t.rank
    blocks = [None] * n
    blocks[r] = x
    for s in range(n - 1):
        if r != 0:  # BUG: rank 0 forgets to pass blocks on
            t.isend(blocks[(r - s) % n], (r + 1) % n)
        blocks[(r - s - 1) % n] = t.recv((r - 1) % n)  # HANG-LINE
    return blocks


def reduce_scatter(t, x):
    n, r = t.world_size, t.rank
    full = x.reshape(-1).clone()
    gathered = [full]
    for s in range(n - 1):  # everyone sends everything: slow, but correct
        t.isend(full, (r + 1 + s) % n)
    for s in range(n - 1):
        gathered.append(t.recv((r - 1 - s) % n))
    total = sum(gathered[1:], gathered[0].clone())
    size = -(-full.numel() // n) if full.numel() else 0
    return total[r * size:(r + 1) * size]


def torch_style_recv(t, x):
    """Receives into a buffer, as torch.distributed.recv(tensor, src) does: not this
    transport's recv(src), which returns the tensor."""
    out = x.clone()
    for peer in range(t.world_size):
        if peer != t.rank:
            t.send(x, peer) if t.rank < peer else None
            buffer = torch.empty_like(x)
            t.recv(buffer, peer)  # MISUSE-LINE
            out += buffer
    return out
