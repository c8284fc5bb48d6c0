"""Jobs the tests run on real ranks (module-level, so they pickle by reference)."""

from __future__ import annotations

import os
import re
import threading
import time

import torch
import torch.distributed as dist


def rank_sum(ctx, length: int) -> list[float]:
    """All-reduce a tensor holding rank + 1: every rank ends with 1 + 2 + ... + N."""
    tensor = torch.full((length,), float(ctx.rank + 1))
    dist.all_reduce(tensor)
    return tensor.tolist()


def whoami(ctx) -> tuple[int, int, int]:
    return ctx.rank, dist.get_world_size(), os.getpid()


def raise_on_rank(ctx, bad_rank: int) -> None:
    if ctx.rank == bad_rank:
        raise ValueError(f"rank {bad_rank} is broken")  # RAISE-LINE
    tensor = torch.ones(2)
    dist.all_reduce(tensor)


def raise_while_peer_waits(ctx) -> None:
    """Rank 0 raises; rank 1 waits on something no socket error can interrupt."""
    if ctx.rank == 0:
        raise RuntimeError("rank 0 gave up")
    threading.Event().wait()  # PEER-WAIT-LINE


def p2p_cycle_with_helper_thread(ctx) -> None:
    """Every rank blocks receiving from its right neighbour; a named helper thread idles."""
    helper = threading.Thread(target=threading.Event().wait, name=f"helper-{ctx.rank}",
                              daemon=True)
    helper.start()
    buffer = torch.zeros(4)
    dist.recv(buffer, src=(ctx.rank + 1) % ctx.world_size)  # RECV-LINE


def hold_the_gil(ctx) -> None:
    """Catastrophic regex backtracking: the GIL is never released, so only a signal works."""
    ctx.progress()
    re.match(r"(a+)+$", "a" * 64 + "b")  # GIL-LINE


def die_on_rank(ctx, bad_rank: int, code: int) -> None:
    if ctx.rank == bad_rank:
        os._exit(code)
    tensor = torch.ones(2)
    dist.all_reduce(tensor)


def emit_then_hang(ctx, count: int) -> None:
    for i in range(count):
        ctx.emit(("tick", i))
    buffer = torch.zeros(1)
    dist.recv(buffer, src=(ctx.rank + 1) % ctx.world_size)


def unpicklable_result(ctx):
    return threading.Lock()


def announce_then_hang(ctx) -> None:
    """Print this rank's pid for a watching test, then block forever."""
    os.write(1, f"rank-pid {os.getpid()}\n".encode())  # one write: lines never interleave
    buffer = torch.zeros(1)
    dist.recv(buffer, src=(ctx.rank + 1) % ctx.world_size)



def many_calls(ctx) -> None:
    """One of every kind of call the tracer must see, each on a marked line."""
    world, rank = ctx.world_size, ctx.rank
    values = torch.full((3,), float(rank))
    dist.all_reduce(values, op=dist.ReduceOp.MAX)  # ALLREDUCE-LINE
    dist.broadcast(torch.zeros(2, 2, dtype=torch.float64), src=world - 1)  # BROADCAST-LINE
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor([rank]))  # ALLGATHER-LINE
    out, inbox = torch.full((4,), float(rank)), torch.zeros(4)
    works = dist.batch_isend_irecv([  # BATCH-LINE
        dist.P2POp(dist.isend, out, (rank + 1) % world),
        dist.P2POp(dist.irecv, inbox, (rank - 1) % world)])
    for work in works:
        work.wait()  # WAIT-LINE
    assert inbox[0] == (rank - 1) % world


def send_cycle(ctx) -> None:
    dist.send(torch.zeros(4), dst=(ctx.rank + 1) % ctx.world_size)  # SEND-CYCLE-LINE


def skip_collective_on_last_rank(ctx) -> None:
    if ctx.rank != ctx.world_size - 1:
        dist.all_reduce(torch.ones(2))  # SKIPPED-LINE


def mismatched_collectives(ctx) -> None:
    if ctx.rank == 0:
        dist.all_reduce(torch.ones(4))  # MISMATCH-ALLREDUCE-LINE
    else:
        dist.broadcast(torch.ones(4), src=0)  # MISMATCH-BROADCAST-LINE


def reduce_op_differs(ctx) -> float:
    values = torch.tensor([float(ctx.rank + 1)])
    op = dist.ReduceOp.SUM if ctx.rank == 0 else dist.ReduceOp.MAX
    dist.all_reduce(values, op=op)  # REDUCE-OP-LINE
    return values.item()


def shape_differs(ctx, shapes) -> None:
    dist.all_reduce(torch.ones(shapes[ctx.rank]))  # SHAPE-LINE


def own_listeners(ctx) -> list[tuple[int, str, int]]:
    """This rank's listening TCP sockets, read inside a job, with the group up."""
    import sockettable

    dist.barrier()
    return [(l.pid, l.address, l.port) for l in sockettable.listeners([os.getpid()])]


def slow_but_healthy(ctx, seconds: float) -> list[float]:
    """No deadlock, only waiting: rank 1 computes while rank 0 waits in an all-reduce, then
    rank 0 computes while rank 1 waits in a receive from it, then a two-stage pipeline whose
    stages wait on each other's compute."""
    x = torch.ones(4)
    if ctx.rank == 1:
        time.sleep(seconds)  # a straggler inside its step
    dist.all_reduce(x)
    if ctx.rank == 0:
        time.sleep(seconds)
        dist.send(x, 1)
    else:
        dist.recv(x, 0)
    for _ in range(3):  # stage 0 -> stage 1 -> back, each computing between
        if ctx.rank == 0:
            dist.send(x, 1)
            dist.recv(x, 1)
        else:
            dist.recv(x, 0)
            time.sleep(seconds / 4)
            dist.send(x + 1, 0)
    return x.tolist()


def cycle_unsettled_then_a_peer_raises(ctx) -> None:
    """Ranks 0 and 1 wait for each other in receives (a cycle), but a thread of rank 1
    writes a trace line every 20 ms, so the proof never holds still long enough to be
    confirmed; then rank 2, which talks to neither, raises. The error grace must decide."""
    from distdoctor.trace.tracer import active

    if ctx.rank == 2:
        time.sleep(0.5)
        raise ValueError("rank 2 gave up")
    if ctx.rank == 1:
        def tick() -> None:
            while True:
                active().write(ev="tick")
                time.sleep(0.02)

        threading.Thread(target=tick, daemon=True).start()
    dist.recv(torch.zeros(1), 1 - ctx.rank)


def same_ranks_other_group(ctx) -> None:
    """A group of every rank, made anew: rank 0 all-reduces on it, the others on the
    default group, which has the same ranks and is another channel."""
    group = dist.new_group(list(range(ctx.world_size)))
    dist.all_reduce(torch.ones(2), group=group if ctx.rank == 0 else None)  # OTHER-GROUP-LINE


def ddp_with_a_straggler(ctx, seconds: float) -> list[float]:
    """Healthy DDP steps, each followed by a loss all-reduce, with the last rank sleeping
    ``seconds`` before it in the first two steps: the others wait in a traced collective
    long enough for the watch to ask the Flight Recorder, which must prove nothing."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 4))
    losses = []
    for step in range(3):
        loss = model(torch.ones(2, 4)).pow(2).mean()
        loss.backward()
        if ctx.rank == ctx.world_size - 1 and step < 2:
            time.sleep(seconds)
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(round(total.item() / ctx.world_size, 6))
    return losses


def tagged_exchange(ctx, cycle: bool) -> list[float]:
    """Rank 0 sends tags 1 then 2, rank 1 receives tag 2 first: healthy, as gloo pairs by
    tag. With ``cycle``, both ranks send with tag 5 before receiving: a deadlock."""
    peer = 1 - ctx.rank
    if cycle:
        dist.send(torch.ones(1), peer, tag=5)  # TAGGED-SEND-LINE
        dist.recv(torch.ones(1), peer, tag=5)
        return []
    got = [torch.zeros(1), torch.zeros(1)]
    if ctx.rank == 0:
        works = [dist.isend(torch.full((1,), float(tag)), 1, tag=tag) for tag in (1, 2)]
        for work in works:
            work.wait()
    else:
        dist.recv(got[1], 0, tag=2)
        dist.recv(got[0], 0, tag=1)
    return [t.item() for t in got]



def join_or_die(original, dying_rank: int):
    """A stand-in for the rank's _join_group (patched in before the fork) in which
    ``dying_rank`` exits before it joins."""
    def join(ctx, host):
        if ctx.rank == dying_rank:
            os._exit(3)
        return original(ctx, host)
    return join


def ddp_training(ctx, steps: int) -> None:
    """A user's clean DDP training: every parameter used on every rank."""
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()


def all_reduce_with_a_broken_tracer(ctx) -> float:
    """The tracer fails inside its hook: the user's all-reduce must go on regardless."""
    from distdoctor.trace.tracer import active

    def broken(*args, **kwargs):
        raise ZeroDivisionError("the tracer's own bug")

    active()._describe = broken
    try:
        tensor = torch.ones(1)
        dist.all_reduce(tensor)
        dist.all_reduce(tensor)
        return tensor.item()
    finally:
        del active()._describe  # the warm pool's next job is traced again


def loader_of_named_samples(ctx) -> list:
    """A DataLoader whose sampler yields names, not numbers: the batch recorder cannot
    write them down, and the user's loop must not notice."""
    from torch.utils.data import DataLoader

    data = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    loader = DataLoader(data, sampler=sorted(data), batch_size=2)
    return [batch.tolist() for batch in loader]


def abort_slowly_after_a_peer_raises(ctx) -> None:
    """Rank 0 raises; rank 1 begins to abort as gloo does (faulthandler's first line on
    stderr), slower than the error grace (as a loaded machine writes its stacks), then
    aborts."""
    import sys

    if ctx.rank == 0:
        raise RuntimeError("rank 0 saw the size mismatch first")
    time.sleep(0.2)
    sys.stderr.write("Fatal Python error: Aborted\n\n")
    sys.stderr.flush()
    time.sleep(2.0)  # longer than the error grace: the watch has begun to stop it
    os.abort()


def load_slow_modules(count: int, each_s: float) -> int:
    """Import ``count`` fresh modules that each take ``each_s`` to load (what DDP's first
    construction does on a loaded machine, where its 800 imports take seconds): a rank
    that is moving the whole time, yet makes no call. How many modules it loaded."""
    import importlib
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        sys.path.insert(0, folder)
        try:
            names = [f"slow_module_{os.getpid()}_{n}" for n in range(count)]
            for name in names:
                with open(os.path.join(folder, f"{name}.py"), "w") as module:
                    module.write(f"import time\ntime.sleep({each_s})\n")
            importlib.invalidate_caches()
            for name in names:
                importlib.import_module(name)
        finally:
            sys.path.remove(folder)
    return count


def all_reduce_after_slow_imports(ctx, count: int, each_s: float) -> float:
    """Load code for count * each_s seconds with no call, then one all-reduce."""
    load_slow_modules(count, each_s)
    x = torch.ones(1)
    dist.all_reduce(x)
    return float(x)


def tp_dropout_masks(ctx, seed: int | None, steps: int) -> list[list[float]]:
    """A user's tensor-parallel MLP: dropout on the column-parallel layer's ReLU output
    (each rank's slice) and on the row-parallel output (whole), trained ``steps`` steps with
    dropout drawn from ``seed`` (None: a seed per rank). Returns, per step, the sliced
    dropout's mask at the positions the tracer samples, replayed by torch's own dropout on
    ones from the RNG state the layer draws from: kept 1, dropped 0, and -1 where the input
    was 0 (no mask to read from an output there)."""
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from distdoctor.analysis.positions import spread_positions
    from distdoctor.trace.tensorparallel import MASK_SAMPLE

    mesh = init_device_mesh("cpu", (ctx.world_size,))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Dropout(0.25), nn.Linear(64, 8),
                          nn.Dropout(0.25))
    model = parallelize_module(model, mesh, {"0": ColwiseParallel(), "3": RowwiseParallel()})
    torch.manual_seed(ctx.rank + 10 if seed is None else seed)
    masks: list[list[float]] = []

    def replay(module, inputs):
        if len(masks) > step[0]:
            return  # one per step: the first forward's, as the tracer samples
        state = torch.get_rng_state()
        x = inputs[0].detach().reshape(-1)
        kept = nn.functional.dropout(torch.ones_like(x), module.p, True).ne(0)
        torch.set_rng_state(state)  # the layer then draws exactly this mask
        masks.append([(1.0 if kept[i] else 0.0) if x[i] != 0 else -1.0
                      for i in spread_positions(x.numel(), MASK_SAMPLE)])

    model[2].register_forward_pre_hook(replay)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(8 * steps, 8, generator=torch.Generator().manual_seed(0))
    step = [0]
    for step[0] in range(steps):
        optimizer.zero_grad()
        model(data[step[0] * 8:(step[0] + 1) * 8]).pow(2).mean().backward()
        optimizer.step()
    return masks


def tp_dropout_beside_a_slice(ctx, steps: int) -> None:
    """A healthy tensor-parallel block whose dropout, on the block's whole input, runs after
    a column-parallel layer whose slice has the input's shape (8 of 16 columns on 2 ranks),
    every rank seeded alike, as a whole tensor's dropout must be."""
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.down = nn.Linear(8, 8 * ctx.world_size), nn.Linear(8 * ctx.world_size, 8)
            self.drop = nn.Dropout(0.25)

        def forward(self, x):
            hidden = torch.relu(self.up(x))
            return self.drop(x) + self.down(hidden)

    mesh = init_device_mesh("cpu", (ctx.world_size,))
    torch.manual_seed(0)
    model = parallelize_module(Block(), mesh, {"up": ColwiseParallel(),
                                               "down": RowwiseParallel()})
    torch.manual_seed(1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(8 * steps, 8, generator=torch.Generator().manual_seed(0))
    for step in range(steps):
        optimizer.zero_grad()
        model(data[step * 8:(step + 1) * 8]).pow(2).mean().backward()
        optimizer.step()
