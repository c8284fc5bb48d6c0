"""The training workload every strategy runs: a small MLP on synthetic regression data.

Small on purpose: every parameter fits in a fingerprint, so spreads between ranks and the
distance from the single-process reference are exact, and a step costs microseconds.
Samples carry ids (their row numbers) so ranks can record exactly what they trained on.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from distdoctor.models import RunSpec

AUX_WEIGHT = 0.1  # the aux head's share of the loss; a rank that skips it leaves it unused
STRAGGLER_S = 0.02  # what the straggler knob adds to one rank's every step: many steps'
# worth of this workload, so the others wait for it most of each step


def straggle(spec: RunSpec, rank: int, where: str) -> None:
    """The straggler knob's delay, if ``rank`` is the one it slows at ``where``: "loader",
    its batch arrives late (a wait, as on slow storage); "work", it computes for that long
    after its optimiser step (as a rank that logs, evaluates or checkpoints alone)."""
    if rank != spec.knobs.straggler_rank or where != spec.knobs.straggler_in:
        return
    if where == "loader":
        time.sleep(STRAGGLER_S)
        return
    ends = time.monotonic() + STRAGGLER_S
    x = torch.ones(64, 64)
    while time.monotonic() < ends:
        x = torch.tanh(x @ x)


class MLP(nn.Module):
    """Two tanh layers, a regression head and an auxiliary head that shares the trunk."""

    def __init__(self, in_features: int, hidden_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.fc2 = nn.Linear(hidden_features, hidden_features)
        self.head = nn.Linear(hidden_features, 1)
        self.aux = nn.Linear(hidden_features, 1)

    def forward(self, x: torch.Tensor, use_aux: bool = True, masks=None):
        """``masks``: dropout after each tanh, as two scaled keep-masks (see dropout.py)."""
        h = torch.tanh(self.fc1(x))
        if masks is not None:
            h = h * masks[0]
        h = torch.tanh(self.fc2(h))
        if masks is not None:
            h = h * masks[1]
        return self.head(h), (self.aux(h) if use_aux else None)


def loss_fn(out: torch.Tensor, aux: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
    loss = nn.functional.mse_loss(out, y)
    return loss if aux is None else loss + AUX_WEIGHT * nn.functional.mse_loss(aux, y)


def build_model(spec: RunSpec, rank: int) -> MLP:
    """The model as this rank initialises it (identical on every rank unless a knob says)."""
    torch.manual_seed(spec.seed + (rank if spec.knobs.seed_init_per_rank else 0))
    return MLP(spec.in_features, spec.hidden_features)


def optimizer_class(spec: RunSpec) -> type[torch.optim.Optimizer]:
    return torch.optim.Adam if spec.optimizer_name == "adam" else torch.optim.SGD


def make_optimizer(params, spec: RunSpec) -> torch.optim.Optimizer:
    """The spec's optimiser over ``params`` (a strategy's shards, or the whole model)."""
    if spec.optimizer_name == "adam":
        return torch.optim.Adam(params, lr=spec.learning_rate)
    return torch.optim.SGD(params, lr=spec.learning_rate)


def make_dataset(spec: RunSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets for sample ids 0..num_samples-1, the same on every rank."""
    gen = torch.Generator().manual_seed(10_000 + spec.seed)
    x = torch.randn(spec.num_samples, spec.in_features, generator=gen)
    w = torch.randn(spec.in_features, 1, generator=gen)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(spec.num_samples, 1, generator=gen)
    return x, y


def epoch_of(spec: RunSpec, step: int) -> int:
    return (step - 1) // spec.steps_per_epoch


def batch_ids(spec: RunSpec, rank: int, step: int) -> list[int]:
    """The sample ids ``rank`` trains on at ``step`` (1-based), per the spec's sampler knobs."""
    return batch_ids_at(spec, rank, epoch_of(spec, step), (step - 1) % spec.steps_per_epoch)


def batch_ids_at(spec: RunSpec, rank: int, epoch: int, within: int) -> list[int]:
    """The sample ids ``rank`` trains on as the ``within``-th batch (0-based) of ``epoch``:
    the loader's place, which a checkpoint must keep for a resumed run to read on.

    The distributed sampler shuffles with a seed every rank shares (seed + epoch), drops the
    ragged tail, and deals the order out round-robin to the replicas, so an epoch's shares
    are disjoint; the ranks of one tensor-parallel group are one replica and read the same.
    """
    knobs = spec.knobs
    shuffle_epoch = epoch if knobs.sampler_set_epoch else 0
    gen = torch.Generator().manual_seed(spec.seed + shuffle_epoch)
    order = torch.randperm(spec.num_samples, generator=gen)
    replicas = spec.dp_degree
    usable = order[: spec.steps_per_epoch * replicas * spec.batch_size]
    shard = spec.replica(rank) if knobs.sampler == "distributed" else 0
    mine = usable[shard:: replicas]
    return mine[within * spec.batch_size: (within + 1) * spec.batch_size].tolist()


JITTER_SEED = 7_919  # the input jitter's RNG: seed + JITTER_SEED + rank, apart from init's


def jitter_seed(spec: RunSpec, rank: int) -> int:
    """The seed ``rank`` gives torch's RNG for its input jitter: its own, as per-rank
    augmentation is (so a checkpoint must keep every rank's RNG state, not one)."""
    return spec.seed + JITTER_SEED + rank


def jittered(spec: RunSpec, inputs: torch.Tensor, generator=None) -> torch.Tensor:
    """``inputs`` scaled row by row by 1 + jitter * (u - 0.5), u drawn from ``generator``
    (torch's default RNG when None): one draw per batch, before it is cut into
    micro-batches, so the single-process reference draws the same numbers."""
    if not spec.knobs.input_jitter:
        return inputs
    u = torch.rand(inputs.shape[0], 1, generator=generator)
    return inputs * (1 + spec.knobs.input_jitter * (u - 0.5))


def make_scheduler(optimizer: torch.optim.Optimizer, spec: RunSpec):
    """The spec's learning-rate schedule: lr * lr_decay**step (LambdaLR, closed form, so a
    scheduler that is not restored starts its decay over)."""
    decay = spec.knobs.lr_decay
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: decay ** step)
