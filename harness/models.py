"""The run data model: what goes into a run, what ranks record, what checks conclude.

Everything here is a frozen dataclass that survives a JSON round trip, so a record written
by one run (or one machine) can be re-checked later by a newer detector without re-running.
A fault changes a RunSpec's knobs and nothing else; a check reads a RunRecord and nothing
else. Bump SCHEMA_VERSION whenever a field changes meaning.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.jsoncodec import SchemaError, from_json, to_json

SCHEMA_VERSION = 1
REPORT_SCHEMA = f"distdoctor.report.v{SCHEMA_VERSION}"

RankStatus = Literal["finished", "raised", "died", "hung", "stopped"]
SamplerKind = Literal["distributed", "shared-seed"]
AuxSkip = Literal["none", "odd-ranks", "all-ranks"]
P2POrder = Literal["even-odd", "send-first", "batched"]
StageSplit = Literal["flops", "params", "time"]
OptimizerName = Literal["auto", "sgd", "adam"]
Outcome = Literal["healthy", "unhealthy", "fixed", "not-fixed", "masked", "not-reproduced"]


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
    deadline: float = 30.0  # seconds without progress before the ranks count as hung
    fingerprint_values: int = 4096  # values kept per fingerprint (all, for these models)
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
        if not (self.deadline > 0 and math.isfinite(self.deadline)):
            yield f"deadline must be a positive number of seconds, got {self.deadline}"
        if self.lr is not None and not (self.lr > 0 and math.isfinite(self.lr)):
            yield f"lr must be positive, got {self.lr}"

    @property
    def is_pipeline(self) -> bool:
        """Pipeline strategies are named pipe-* (hand-rolled) or torch-pipe-*."""
        return "pipe-" in self.strategy

    @property
    def optimizer_name(self) -> str:
        """"auto" means Adam where the strategy shards optimiser state (SGD has none to
        shard, so ZeRO would save nothing) and SGD elsewhere (its update shows a gradient's
        scale undistorted)."""
        if self.optimizer != "auto":
            return self.optimizer
        from harness.strategies import SHARDED

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
        """Samples per optimiser step: batch-size per rank for data parallelism, batch-size
        in all for a pipeline (its ranks hold stages, not replicas)."""
        return self.batch_size if self.is_pipeline else self.world_size * self.batch_size

    @property
    def steps_per_epoch(self) -> int:
        return self.num_samples // (self.world_size * self.batch_size)

    def uses_aux(self, rank: int) -> bool:
        skip = self.knobs.aux_skipped_on
        return skip == "none" or (skip == "odd-ranks" and rank % 2 == 0)


@dataclass(frozen=True)
class Fingerprint:
    """A tensor set in brief: exact digest and norm, plus a strided sample of its values.

    ``values`` holds every value when there are at most RunSpec.fingerprint_values of them,
    so spreads and reference differences over the sample are exact for small models and a
    lower bound otherwise; equal digests mean bit-identical tensors.
    """

    numel: int
    digest: str
    norm: float
    values: tuple[float, ...]


@dataclass(frozen=True)
class StepEvidence:
    """What one rank saw and did in one optimiser step."""

    step: int  # 1-based
    epoch: int
    sample_ids: tuple[int, ...]
    loss: float
    params: Fingerprint  # after the optimiser step
    grad_local: Fingerprint | None  # this rank's gradient before synchronisation
    grad_synced: Fingerprint | None  # the gradient the optimiser used
    allreduce_calls: int  # gradient all-reduces issued in this step
    allreduce_bytes: int  # bytes handed to those all-reduces
    gradient_bytes: int  # bytes of all gradients: what one synchronisation must move
    seconds: float = 0.0  # wall time of forward, backward, sync and optimiser step, without
    # the evidence gathered after it (0.0 in records written before it was measured)


@dataclass(frozen=True)
class BackwardEvidence:
    """Which parameters got a gradient, recorded before the step's first gradient sync.

    Emitted before the collective that a missing gradient would hang or break, so it
    reaches the parent even when that collective never returns.
    """

    step: int
    no_grad_params: tuple[str, ...]  # parameters that got no gradient from this rank's loss


@dataclass(frozen=True)
class StageCost:
    """One pipeline stage: its layers, parameters and FLOPs per micro-batch (counted with
    torch.utils.flop_counter.FlopCounterMode)."""

    stage: int
    first_layer: int
    end_layer: int  # exclusive
    kinds: str  # the block kinds, e.g. "mmaa"
    params: int
    forward_flops: int
    backward_flops: int


@dataclass(frozen=True)
class StageEvent:
    """One forward (F) or backward (B, or W for weights only) of one stage on one micro-batch.

    start and end are on the machine-wide monotonic clock; cpu is the thread's CPU time,
    which other processes sharing the core do not inflate.
    """

    step: int
    stage: int
    micro: int
    kind: str
    start: float
    end: float
    cpu: float


@dataclass(frozen=True)
class PipeStepEvidence:
    """One pipeline rank's optimiser step."""

    step: int
    loss: float | None  # on the rank that holds the last stage
    params: Fingerprint  # after the step
    grads: Fingerprint  # before the step
    start: float
    end: float


@dataclass(frozen=True)
class Call:
    """One point-to-point or collective call a rank made, as its tracer recorded it.

    ``seq`` numbers the call on its group (collectives) or on its channel (this rank's
    sends to one peer, or receives from one peer), so calls that should meet across
    ranks share a number. Times are on the machine-wide monotonic clock.
    """

    id: int
    rank: int
    op: str
    seq: int
    group: tuple[int, ...]
    peer: int | None
    peers: tuple[tuple[str, int], ...]  # batch_isend_irecv: ("send"|"recv", peer) each
    shapes: tuple[tuple[int, ...], ...]
    dtype: str
    reduce_op: str | None
    where: str  # the user's file:line
    async_op: bool
    entered: float
    waited: float | None = None  # when the owner started waiting on an async call
    wait_where: str = ""
    completed: float | None = None
    error: str | None = None

    @property
    def blocking(self) -> bool:
        """Is the rank inside this call right now (entered a blocking call, or waiting)?"""
        if self.completed is not None or self.error is not None:
            return False
        return not self.async_op or self.waited is not None


@dataclass(frozen=True)
class MemoryEvidence:
    """Bytes of training state one rank held in one step, summed over the storages of the
    tensors it actually held (each storage once, padding included), after the optimiser
    step while the step's gradients still live.

    ``gathered`` is the peak of unsharded parameters and their unsharded gradients held at
    once during forward and backward (ZeRO-3 and FSDP gather a layer, use it and free it; 0
    where parameters are never sharded). ``optimizer`` includes Adam's step counters, one
    4-byte scalar per tensor the optimiser steps (``optimizer_tensors`` of them).
    """

    step: int
    stage: int  # 0: every state replicated (DDP); 1-3: the ZeRO stage the strategy implements
    world_size: int
    params: int
    grads: int
    optimizer: int
    gathered: int
    budget: int  # bytes this rank may hold (0: no limit)
    model_params: int  # parameters in the model, P
    largest_layer: int  # parameters in its largest layer, L
    layers: int  # modules owning parameters (ZeRO pads each layer's shard separately)
    optimizer_tensors: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.gathered


@dataclass(frozen=True)
class Evidence:
    """Everything one rank recorded over a run."""

    rank: int
    built_params: Fingerprint | None = None  # as this rank built them, before any wrapping
    initial_params: Fingerprint | None = None  # after construction (and any broadcast)
    backward: tuple[BackwardEvidence, ...] = ()
    steps: tuple[StepEvidence, ...] = ()
    holds: str = "replica"  # the parameters this rank holds: a full replica, or stages
    stages: tuple[StageCost, ...] = ()
    stage_events: tuple[StageEvent, ...] = ()
    pipe_steps: tuple[PipeStepEvidence, ...] = ()
    calls: tuple[Call, ...] = ()  # every p2p and collective call, from the tracer
    ddp_params: tuple[str, ...] = ()  # the last DDP's parameters, in its reducer's order
    memory: tuple[MemoryEvidence, ...] = ()  # training state held, per step


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str
    code: str = ""

    def __str__(self) -> str:
        text = f'  File "{self.file}", line {self.line}, in {self.function}'
        return f"{text}\n    {self.code}" if self.code else text


@dataclass(frozen=True)
class ThreadStack:
    """One thread's Python stack, outermost frame first."""

    name: str
    main: bool
    frames: tuple[Frame, ...]

    def __str__(self) -> str:
        head = f"Thread {self.name}{' (main)' if self.main else ''}, most recent call last:"
        return "\n".join([head, *map(str, self.frames)])


@dataclass(frozen=True)
class RankEnd:
    """How one rank's job ended: its traceback if it raised, its stacks if it was stopped."""

    rank: int
    status: RankStatus
    at: float | None = None  # seconds after the job started
    error: str | None = None  # full traceback text, or how the process died
    exitcode: int | None = None
    stacks: tuple[ThreadStack, ...] = ()  # every thread, captured before the rank was killed
    raw_stack: str | None = None  # faulthandler text, when the rank could not answer itself
    stderr: str = ""  # the tail of what the rank wrote to stderr during the job

    @property
    def ok(self) -> bool:
        return self.status == "finished"

    @property
    def headline(self) -> str:
        """The exception line of the last traceback in ``error``; for a rank that died, the
        C++ exception it died of ("what(): ..."); else the last line."""
        lines = (self.error or "").rstrip().splitlines()
        fatal = [line.strip() for line in lines if line.strip().startswith("what():")]
        if self.status == "died" and fatal:
            return fatal[-1]
        starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
        if starts:
            for line in lines[starts[-1] + 1:]:
                if line and not line[0].isspace():
                    return line
        return lines[-1].strip() if lines else ""


@dataclass(frozen=True)
class RankRecord:
    rank: int
    end: RankEnd
    evidence: Evidence


@dataclass(frozen=True)
class RunRecord:
    """One run: its spec, each rank's evidence and end, and how long it took."""

    spec: RunSpec
    ranks: tuple[RankRecord, ...]
    wall_s: float
    torch_version: str = ""
    schema_version: int = SCHEMA_VERSION
    started: float = 0.0  # job start on the machine-wide monotonic clock (RankEnd.at is after it)

    @property
    def finished(self) -> bool:
        return all(r.end.ok for r in self.ranks)


@dataclass(frozen=True)
class Finding:
    """A detected failure mode, with the numbers that show it and the fix as knob changes."""

    check: str  # the detector that found it
    fault: str  # the failure mode it indicates
    symptom: str  # with the measured numbers
    cause: str
    fix: str
    fix_changes: dict[str, Any]  # dotted RunSpec path -> new value, e.g. "knobs.sampler"
    ranks: tuple[int, ...] = ()
    measured: dict[str, Any] = field(default_factory=dict)
    headline: str = ""  # the key number in a few words, for tables

    def apply_fix(self, spec: RunSpec) -> RunSpec:
        return apply_changes(spec, self.fix_changes)


@dataclass(frozen=True)
class ReferenceComparison:
    """Distance of the distributed run from a single-process run on the same samples."""

    max_abs_diff: float
    per_step: tuple[float, ...]
    tolerance: float = 1e-5

    @property
    def matches(self) -> bool:
        return self.max_abs_diff <= self.tolerance


@dataclass(frozen=True)
class Assessment:
    """What the checks and the reference say about one run."""

    findings: tuple[Finding, ...]
    reference: ReferenceComparison | None
    param_spread: float | None  # largest difference between replicas, any step (None: no replicas)
    ranks_finished: bool
    spread_tolerance: float = 1e-6

    @property
    def healthy(self) -> bool:
        spread_ok = self.param_spread is None or self.param_spread <= self.spread_tolerance
        reference_ok = self.reference is not None and self.reference.matches
        return self.ranks_finished and not self.findings and spread_ok and reference_ok


@dataclass(frozen=True)
class Verdict:
    """The run before any fix, the run after it (if one was applied), and what that means.

    outcome: ``healthy``/``unhealthy`` for a single run; for an injected fault ``fixed``
    (found, and gone after the fix with the reference matched), ``not-fixed``, ``masked``
    (the strategy itself prevents the fault: see ``note``) or ``not-reproduced``.
    """

    outcome: Outcome
    before: Assessment
    after: Assessment | None = None
    note: str = ""

    @property
    def passed(self) -> bool:
        return self.outcome in ("healthy", "fixed", "masked")

    @property
    def final(self) -> Assessment:
        return self.after if self.after is not None else self.before


@dataclass(frozen=True)
class RunReport:
    """What the command line writes: the run, the run after a fix (if any), the verdict."""

    record: RunRecord
    verdict: Verdict
    fixed_record: RunRecord | None = None
    fault: str | None = None  # "id" or "id:variant" when a fault was injected on purpose
    schema: str = REPORT_SCHEMA


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


def dump_report(report: RunReport, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(to_json(report), indent=1) + "\n")
    tmp.replace(path)


def load_report(path: str | Path) -> RunReport:
    data = json.loads(Path(path).read_text())
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != REPORT_SCHEMA:
        raise SchemaError(f"{path}: schema {schema!r}, this distdoctor reads {REPORT_SCHEMA!r}")
    return from_json(RunReport, data)
