"""The evidence's cost inside a rank, for bench/run_overhead.py: two identical DDP models
of 1.05M parameters on the same ranks, one built before the evidence hooks existed (no
hooks at all) and one after, trained in alternating blocks of a few steps with the
evidence off and on. Adjacent blocks share the machine's state of the moment, so their
ratio is a paired measurement; whole runs side by side drift by +-10% on a shared 2-core
machine, which is more than the cost to be measured."""

from __future__ import annotations

import os
import time


def evidence_blocks(ctx, rounds: int, steps: int, null: bool = False) -> list[float]:
    """On every rank: per round, CPU seconds per step with the evidence on over off.
    ``null``: both blocks of a pair with the evidence off, on the bare model (the
    measurement's own bias, expected 1.00)."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    from torch.utils.data.sampler import BatchSampler

    from harness.trace.batches import record_batches
    from harness.trace.gradients import record_gradients
    from harness.trace.nonfinite import record_nonfinite
    from harness.trace.steps import step_hooks
    from harness.trace.tracer import Tracer

    def built() -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = DistributedDataParallel(nn.Sequential(
            nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
            nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1)))
        return model, torch.optim.SGD(model.parameters(), lr=1e-3)

    saved = BatchSampler.__iter__, torch.Tensor.backward, torch.optim.Optimizer.__init__
    bare = built()  # before the hooks: no evidence at all
    tracer = Tracer(os.open(os.devnull, os.O_WRONLY), dist.get_rank())
    record_batches(tracer)
    record_gradients(tracer)
    record_nonfinite(tracer)
    hooked = built()
    patched = BatchSampler.__iter__, torch.Tensor.backward
    hooks = step_hooks(tracer)
    callbacks = list(hooks.accumulated), list(hooks.before_step)
    data = TensorDataset(torch.randn(32 * steps * 2, 512), torch.randn(32 * steps * 2, 1))
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data))

    def block(model: nn.Module, optimizer: torch.optim.Optimizer) -> float:
        dist.barrier()
        start = time.process_time()
        for i, (x, y) in enumerate(loader):
            if i == steps:
                break
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return (time.process_time() - start) / steps

    def evidence(on: bool) -> None:
        """Off: the patches undone, no callbacks, and the global pre-step hook (the one
        part that cannot be removed) kept from hooking the bare model's parameters."""
        BatchSampler.__iter__, torch.Tensor.backward = patched if on else saved[:2]
        hooks.accumulated[:], hooks.before_step[:] = callbacks if on else ([], [])
        if on:
            hooks.__dict__.pop("_hook", None)
        else:
            hooks._hook = lambda params: None

    try:
        for on in (False, True):  # warm both
            evidence(on)
            block(*(hooked if on else bare))
        ratios = []
        for r in range(rounds):  # alternate which goes first, so drift hits both alike
            times = {}
            for on in ((False, True) if r % 2 == 0 else (True, False)):
                evidence(on and not null)
                times[on] = block(*(hooked if on and not null else bare))
            ratios.append(times[True] / times[False])
        return ratios
    finally:
        BatchSampler.__iter__, torch.Tensor.backward, torch.optim.Optimizer.__init__ = saved
