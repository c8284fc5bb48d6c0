"""The evidence's cost inside a rank, for bench/run_overhead.py: one DDP model of 1.05M
parameters trained in alternating blocks of steps with the evidence on and off.
Adjacent blocks share the machine's state of the moment, so their ratio is a paired
measurement; whole runs side by side drift by +-10% on a shared 2-core machine, which is
more than the cost to be measured.

What makes the pairs fair: a block is a whole number of the gradient recorder's strides
(every stride has one sampled step, as a real run does; with blocks of one step, the
alternation's phase put every sampled step in the "on" blocks and the median hid
them); the same model in both (off: its hooks removed and the patches undone, so no
second model with a cache state of its own); and each of the two loaders in one long
pass (a pass's first batch looks up the script's line, once per epoch in a real run),
one drawn through the patched batch sampler and one not.
"""

from __future__ import annotations

import os
import time

# the clocks a block is timed by: wall time (what a step costs the job), the process's CPU
# time (every thread: torch's intra-op threads and gloo's too, whose work the evidence
# does not change, so the ratio is diluted by them), and the main thread's CPU time
# (where the evidence runs; the compute torch spreads over its other threads is left
# out, so this ratio overstates the share of a step)
CLOCKS = {"wall": time.perf_counter, "process CPU": time.process_time,
          "main thread CPU": time.thread_time}


def train_block(model, optimizer, batches, count: int) -> tuple[float, ...]:
    """``count`` training steps on batches drawn from ``batches``, every rank starting
    together: seconds per step by each of CLOCKS."""
    import torch.distributed as dist
    from torch import nn

    dist.barrier()
    start = [clock() for clock in CLOCKS.values()]
    for _ in range(count):
        x, y = next(batches)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return tuple((clock() - began) / count for clock, began in zip(CLOCKS.values(), start))


def evidence_blocks(ctx, rounds: int, steps: int,
                    null: bool = False) -> dict[str, list[float]]:
    """On every rank: per round and clock, seconds per step with the evidence on over
    off. ``null``: both blocks of a pair with the evidence off (the measurement's own
    bias, expected 1.00)."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    from torch.utils.data.sampler import BatchSampler

    from distdoctor.trace.batches import record_batches
    from distdoctor.trace.gradients import DENSE, record_gradients
    from distdoctor.trace.nonfinite import record_nonfinite
    from distdoctor.trace.optimizer import record_optimizer
    from distdoctor.trace.steps import step_hooks
    from distdoctor.trace.tracer import Tracer

    saved = BatchSampler.__iter__, torch.Tensor.backward, torch.optim.Optimizer.__init__
    tracer = Tracer(os.open(os.devnull, os.O_WRONLY), dist.get_rank())
    record_batches(tracer)
    record_gradients(tracer)
    record_nonfinite(tracer)
    record_optimizer(tracer)
    patched_backward = torch.Tensor.backward
    hooks = step_hooks(tracer)
    callbacks = list(hooks.accumulated), list(hooks.before_step)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(
        nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
        nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)  # hooked as it is made
    params = list(model.parameters())
    total = (rounds * 2 + 4) * steps + DENSE
    data = TensorDataset(torch.randn(32 * total * 2, 512), torch.randn(32 * total * 2, 1))

    def loader():
        return iter(DataLoader(data, batch_size=32, sampler=DistributedSampler(data)))

    traced = loader()  # its batch sampler's pass began under the patch: every batch a line
    BatchSampler.__iter__ = saved[0]
    plain = loader()

    def evidence(on: bool) -> None:
        """Off: no per-parameter hooks, backward unpatched, no pre-step callbacks, no
        optimiser recorder (the shared global pre- and post-step hooks stay: a call each,
        in both)."""
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        torch.Tensor.backward = patched_backward if on else saved[1]
        hooks.accumulated[:], hooks.before_step[:] = callbacks if on else ([], [])
        handle, optimizer_hook = tracer.optimizer_hook
        handle.remove()
        if on:
            tracer.optimizer_hook = (register_optimizer_step_pre_hook(optimizer_hook),
                                     optimizer_hook)
            hooks.__dict__.pop("_hook", None)
            hooks._hook(params)
        else:
            for _, hooked in hooks.handles.values():
                if hooked is not None:  # unhooked between sampled steps: none
                    hooked.remove()
            hooks.handles.clear()
            hooks._hook = lambda params: None

    def block(batches, count: int) -> tuple[float, ...]:
        return train_block(model, optimizer, batches, count)

    try:
        evidence(True)
        block(traced, DENSE)  # the dense first steps, and warm
        evidence(False)
        block(plain, steps)
        ratios: dict[str, list[float]] = {name: [] for name in CLOCKS}
        for r in range(rounds):  # alternate which goes first, so drift hits both alike
            times = {}
            for on in ((False, True) if r % 2 == 0 else (True, False)):
                evidence(on and not null)
                times[on] = block(traced if on and not null else plain, steps)
            for name, with_it, without in zip(CLOCKS, times[True], times[False]):
                ratios[name].append(with_it / without)
        return ratios
    finally:
        BatchSampler.__iter__, torch.Tensor.backward, torch.optim.Optimizer.__init__ = saved
        evidence(False)
