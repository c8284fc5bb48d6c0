"""What goes into a run: the strategy, its scale and workload, and the knobs a fault flips.

A fault changes a RunSpec's knobs and nothing else, so the spec alone says how a run was
made; ``apply_changes`` is how a finding's fix is applied to it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from distdoctor.models.deadlines import WORKLOAD_S
from distdoctor.models.strategies import SHARDED, TENSOR_PARALLEL, tensor_degree

SamplerKind = Literal["distributed", "shared-seed"]
AuxSkip = Literal["none", "odd-ranks", "all-ranks"]
P2POrder = Literal["even-odd", "send-first", "batched"]
StageSplit = Literal["flops", "params", "time"]
OptimizerName = Literal["auto", "sgd", "adam"]
DropoutRNG = Literal["tracked", "per-rank", "same-for-slices"]
StragglerIn = Literal["loader", "work"]
RestoredRNG = Literal["per-rank", "one-rank"]
RestoredSampler = Literal["epoch-and-position", "epoch-only", "nothing"]
RestoredOptimizer = Literal["every-rank", "rank-0"]
CheckpointKeys = Literal["per-rank", "shared"]


@dataclass(frozen=True)
class Knobs:
    """The settings a correct run gets right and a fault flips (the defaults are correct)."""

    broadcast_params_at_start: bool = True  # hand-rolled DDP syncs rank 0's init to all
    seed_init_per_rank: bool = False  # each rank seeds its own model init with seed + rank
    sampler: SamplerKind = "distributed"  # "shared-seed": every rank draws the same batches
    sampler_set_epoch: bool = True  # reshuffle every epoch (False repeats epoch 0's order)
    average_gradients: bool = True  # divide the all-reduced SUM by the world size
    no_sync_accumulation: bool = True  # skip the gradient sync on all but the last micro-batch
    aux_skipped_on: AuxSkip = "none"  # ranks whose loss leaves the aux head out (the
    # workload's own choice: the reference leaves it out on the same ranks)
    find_unused_parameters: bool = False  # let DDP reduce parameters that got no gradient
    p2p_order: P2POrder = "even-odd"  # how a stage pairs its send and receive to one peer
    stage_split: StageSplit = "time"  # what a pipeline equalises when it cuts the layers:
    # CPU time measured on every rank and averaged, torch-counted FLOPs, or parameter counts
    memory_budget: float = 0.0  # bytes each rank may hold per model parameter, as a device
    # of fixed size would allow (0: no limit); a rank over it stops with out-of-memory
    # tensor parallelism
    tp_output_allreduce: bool = True  # a row-parallel layer sums its ranks' partial outputs
    sequence_parallel: bool = False  # the workload's choice: after fc2 each rank of a
    # tensor-parallel group keeps 1/T of the batch rows (a reduce-scatter), and the
    # replicated layers above (fc2's bias, the heads) see only those rows
    tp_sync_replicated_grads: bool = True  # sum those replicated layers' gradients over
    # the group (each rank's copy gets only its rows' share)
    dropout: float = 0.0  # the workload's choice: dropout after each tanh (0: none)
    tp_dropout_rng: DropoutRNG = "tracked"  # Megatron's RNG tracker: one state shared by the
    # group for replicated activations, one per slice for sharded ones; "per-rank": every
    # rank its own state everywhere; "same-for-slices": one state everywhere
    tp_inside_node: bool = True  # tensor-parallel groups are ranks of one node, data
    # parallelism across nodes (False: the mesh's dimensions swapped)
    straggler_rank: int = -1  # a rank whose every step takes longer (-1: none): its batch
    straggler_in: StragglerIn = "loader"  # arrives late ("loader"), or it does extra work
    # after its optimiser step ("work"), STRAGGLER_S of it (training/workload.py)
    # checkpoint and restart (training/checkpoint.py)
    restart_after: int = 0  # the workload's choice: after this step every rank saves a
    # checkpoint, forgets its state as a restarted process would, and loads it (0: never)
    lr_decay: float = 1.0  # the workload's choice: a LambdaLR scheduler, lr * decay**step
    input_jitter: float = 0.0  # the workload's choice: each rank scales its inputs by
    # 1 + jitter * (u - 0.5), u drawn from torch's RNG seeded per rank (as augmentation)
    restored_rng: RestoredRNG = "per-rank"  # "one-rank": saved under one key for all, so
    # the checkpoint keeps one rank's RNG state and every rank resumes with it
    restore_scheduler: bool = True  # the scheduler's state is saved and loaded
    restored_sampler: RestoredSampler = "epoch-and-position"  # what of the loader's place
    # the checkpoint keeps
    restored_optimizer: RestoredOptimizer = "every-rank"  # "rank-0": only rank 0 loads it
    checkpoint_keys: CheckpointKeys = "per-rank"  # "shared": each rank's shard of the
    # parameters and optimiser state is saved under the same key, so one rank's is kept


@dataclass(frozen=True)
class PipeShape:
    """The pipeline workload: a stack of residual blocks on (batch, seq_len, d_model).

    ``layers`` spells the stack: "m" an MLP block, "a" a self-attention block written out
    as matmuls (so FLOP counters see it). At equal parameter counts an attention block
    costs far more than an MLP block once seq_len is large.
    """

    layers: str = "m" * 12 + "a" * 4
    seq_len: int = 32
    d_model: int = 16


@dataclass(frozen=True)
class RunSpec:
    """One training run: strategy, scale, workload shape, seed, deadline and knobs."""

    strategy: str = "ddp"
    world_size: int = 2
    backend: str = "gloo"
    num_steps: int = 6
    batch_size: int = 8  # samples per rank per optimiser step
    micro_batches: int = 1  # gradient-accumulation micro-batches per optimiser step
    num_samples: int = 64
    in_features: int = 8
    hidden_features: int = 16
    lr: float | None = None  # None: 0.05 for SGD, 1e-3 (torch's default) for Adam
    optimizer: OptimizerName = "auto"  # auto: Adam for sharded strategies, else SGD
    seed: int = 0
    deadline: float = WORKLOAD_S  # seconds without progress before the ranks count as hung
    fingerprint_values: int = 4096  # values kept per fingerprint (all, for these models)
    ranks_per_node: int = 0  # consecutive ranks that share a machine (0: all of them)
    knobs: Knobs = field(default_factory=Knobs)
    pipe: PipeShape = field(default_factory=PipeShape)

    def __post_init__(self) -> None:
        problems = list(self._problems())
        if problems:
            raise ValueError("; ".join(problems))

    def _problems(self):
        positive = ("world_size", "num_steps", "batch_size", "micro_batches", "num_samples",
                    "in_features", "hidden_features", "fingerprint_values")
        for name in positive:
            if getattr(self, name) < 1:
                yield f"{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}"
        if self.batch_size >= 1 and self.micro_batches >= 1 and \
                self.batch_size % self.micro_batches:
            yield (f"batch-size {self.batch_size} is not divisible by micro-batches "
                   f"{self.micro_batches}")
        if self.world_size >= 1 and self.batch_size >= 1 and self.num_samples < self.global_batch:
            yield (f"num-samples {self.num_samples} is smaller than one global batch "
                   f"({self.global_batch} samples)")
        if self.is_tensor and self.world_size >= 1 and self.hidden_features >= 1:
            tp = self.tp_degree
            if self.world_size % tp:
                yield f"{self.strategy} needs an even world size, got {self.world_size}"
            elif self.hidden_features % tp:
                yield (f"hidden-features {self.hidden_features} do not split over {tp} "
                       f"tensor-parallel ranks")
            elif self.knobs.sequence_parallel and (
                    self.batch_size // max(self.micro_batches, 1)) % tp:
                yield (f"sequence parallelism splits each micro-batch's "
                       f"{self.batch_size // max(self.micro_batches, 1)} rows over {tp} "
                       f"tensor-parallel ranks: they must divide evenly")
        if self.ranks_per_node < 0:
            yield f"ranks-per-node must be 0 (all on one node) or more, got {self.ranks_per_node}"
        if not 0.0 <= self.knobs.dropout < 1.0:
            yield f"dropout must be in [0, 1), got {self.knobs.dropout}"
        if self.knobs.dropout and self.knobs.sequence_parallel:
            yield "dropout and sequence parallelism are not combined in the built-in workload"
        if not (self.deadline > 0 and math.isfinite(self.deadline)):
            yield f"deadline must be a positive number of seconds, got {self.deadline}"
        if self.knobs.restart_after < 0:
            yield f"restart-after must be 0 (never) or a step, got {self.knobs.restart_after}"
        if self.lr is not None and not (self.lr > 0 and math.isfinite(self.lr)):
            yield f"lr must be positive, got {self.lr}"

    @property
    def is_pipeline(self) -> bool:
        """Pipeline strategies are named pipe-* (hand-rolled) or torch-pipe-*."""
        return "pipe-" in self.strategy

    @property
    def is_tensor(self) -> bool:
        return self.strategy in TENSOR_PARALLEL

    @property
    def tp_degree(self) -> int:
        """Ranks that share one batch and split the layers between them (1: none)."""
        return tensor_degree(self.strategy, self.world_size)

    @property
    def dp_degree(self) -> int:
        """Data-parallel replicas, each reading its own batches: the ranks over tp_degree."""
        return max(self.world_size // self.tp_degree, 1)

    @property
    def optimizer_name(self) -> str:
        """"auto" means Adam where the strategy shards optimiser state (SGD has none to
        shard, so ZeRO would save nothing) and SGD elsewhere (its update shows a gradient's
        scale undistorted)."""
        if self.optimizer != "auto":
            return self.optimizer
        return "adam" if self.strategy in SHARDED else "sgd"

    @property
    def learning_rate(self) -> float:
        """Adam's step is about lr per element whatever the gradient's scale, so it gets a
        smaller default than SGD; 0.05 would also let float rounding in a near-zero
        gradient move a parameter by more than the 1e-5 the reference allows."""
        if self.lr is not None:
            return self.lr
        return 1e-3 if self.optimizer_name == "adam" else 0.05

    @property
    def global_batch(self) -> int:
        """Samples per optimiser step: batch-size per replica for data parallelism (a
        tensor-parallel group is one replica), batch-size in all for a pipeline (its ranks
        hold stages, not replicas)."""
        return self.batch_size if self.is_pipeline else self.dp_degree * self.batch_size

    @property
    def steps_per_epoch(self) -> int:
        return self.num_samples // (self.dp_degree * self.batch_size)

    def tp_slice(self, rank: int) -> int:
        """Which slice of the split layers ``rank`` holds: its place in its tensor-parallel
        group. The mesh is (data, tensor) with tensor-parallel groups of consecutive ranks,
        or, with the dimensions swapped, (tensor, data): groups strided by dp_degree."""
        tp = self.tp_degree
        return rank % tp if self.knobs.tp_inside_node else rank // self.dp_degree

    def replica(self, rank: int) -> int:
        """Which data-parallel replica (tensor-parallel group) ``rank`` belongs to."""
        tp = self.tp_degree
        return rank // tp if self.knobs.tp_inside_node else rank % self.dp_degree

    def tp_group(self, rank: int) -> tuple[int, ...]:
        """The ranks of ``rank``'s tensor-parallel group, by slice."""
        return tuple(r for r in range(self.world_size) if self.replica(r) == self.replica(rank))

    def dp_group(self, rank: int) -> tuple[int, ...]:
        """The ranks holding the same slice as ``rank``: its data-parallel group."""
        return tuple(r for r in range(self.world_size) if self.tp_slice(r) == self.tp_slice(rank))

    def node_of(self, rank: int) -> int:
        """The machine ``rank`` runs on: consecutive ranks fill a node, as torchrun's
        LOCAL_WORLD_SIZE places them."""
        return rank // self.ranks_per_node if self.ranks_per_node else 0

    def uses_aux(self, rank: int) -> bool:
        skip = self.knobs.aux_skipped_on
        return skip == "none" or (skip == "odd-ranks" and rank % 2 == 0)


def apply_changes(obj: Any, changes: dict[str, Any]) -> Any:
    """Return ``obj`` with dotted-path fields replaced: {"knobs.sampler": "distributed"}."""
    for path, value in changes.items():
        head, _, rest = path.partition(".")
        if head not in {f.name for f in dataclasses.fields(obj)}:
            raise KeyError(f"{type(obj).__name__} has no field {head!r}")
        new = apply_changes(getattr(obj, head), {rest: value}) if rest else value
        if isinstance(new, list):
            new = tuple(new)
        obj = dataclasses.replace(obj, **{head: new})
    return obj
