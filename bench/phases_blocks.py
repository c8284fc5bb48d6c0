"""What timing a step's phases and sampling its gaps costs inside a rank, for
bench/run_overhead.py: a DDP model of 1.05M parameters fed by a DataLoader, trained in
alternating blocks of steps with the phase recorder (trace/phases.py) on and off. Adjacent
blocks share the machine's state of the moment, so their ratio is a paired measurement
(evidence_blocks.py says why whole runs cannot show a cost this small)."""

from __future__ import annotations

import os

from bench.evidence_blocks import CLOCKS, train_block


def phases_blocks(ctx, rounds: int, steps: int, null: bool = False) -> dict[str, list[float]]:
    """On every rank: per round and clock, seconds per step with the phases recorded over
    without. ``null``: both blocks of a pair without (the measurement's own bias)."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from distdoctor.trace.phases import record_phases
    from distdoctor.trace.tracer import Tracer

    tracer = Tracer(os.open(os.devnull, os.O_WRONLY), dist.get_rank())
    tracer.count_optimizer_steps()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(
        nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
        nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    total = (rounds * 2 + 2) * steps
    data = TensorDataset(torch.randn(32 * total * 2, 512), torch.randn(32 * total * 2, 1))
    batches = iter(DataLoader(data, batch_size=32, sampler=DistributedSampler(data)))

    def block(count: int) -> tuple[float, ...]:
        return train_block(model, optimizer, batches, count)

    block(steps)  # warm
    ratios: dict[str, list[float]] = {name: [] for name in CLOCKS}
    for r in range(rounds):  # alternate which goes first, so drift hits both alike
        times = {}
        for on in ((False, True) if r % 2 == 0 else (True, False)):
            recording = record_phases(tracer) if on and not null else None
            try:
                times[on] = block(steps)
            finally:
                if recording is not None:
                    recording.undo()
        for name, with_it, without in zip(CLOCKS, times[True], times[False]):
            ratios[name].append(with_it / without)
    return ratios
