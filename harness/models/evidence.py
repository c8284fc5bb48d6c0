"""What the ranks record as they train: per-step evidence, pipeline events, traced calls,
the memory they held. Detectors read these and nothing else."""

from __future__ import annotations

import math
from dataclasses import dataclass

from distdoctor.models.calls import describe_call, relative_line


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
class BatchEvidence:
    """One batch of sample indices a rank drew from a data loader in a user's script.

    ``epoch`` counts the passes over that loader's batch sampler (each ``for batch in
    loader`` is one); ``trains`` says an optimiser stepped during the pass, which tells a
    training loader from an evaluation one; ``where`` is the script's line that iterates
    the loader (the loop an epoch's ``set_epoch`` belongs before)."""

    loader: int  # which loader, numbered in the order the script first iterated them
    epoch: int  # 0-based pass over this loader
    sample_ids: tuple[int, ...]
    sampler: str  # the sampler's class name, e.g. DistributedSampler
    sampler_epoch: int | None  # DistributedSampler.epoch as the pass began (set_epoch's)
    where: str
    trains: bool = False
    # a digest of the dataset the ids index (trace/datasets.py): ranks whose digests
    # differ draw from datasets of their own, so equal ids name different samples
    data: str = ""
    shuffles: bool | None = None  # its sampler draws each pass in a new order (None: unknown)


@dataclass(frozen=True)
class GradientEvidence:
    """A user's script's gradients at one optimiser step, sampled: as backward left them
    (``local``, before any hand-written synchronisation) and as the optimiser applied them.
    The same positions of every plain (unsharded) parameter the optimiser steps, so two
    ranks' samples compare value for value. Steps whose gradients were not sampled have
    ``local`` and ``applied`` None and the parameters alone."""

    step: int  # 1-based count of the optimiser steps this rank took (any optimiser)
    local: Fingerprint | None
    applied: Fingerprint | None
    params: Fingerprint | None = None  # the same positions of the parameters, before the step
    where: str = ""  # the script's line that called optimizer.step()
    t: float | None = None  # when it was sampled, just before the step (monotonic clock)
    # the storages of the gradients sampled (sampled steps) and of the parameters: what a
    # reduction of them reduced, whatever view of it the script passed
    grad_storages: tuple[int, ...] = ()
    param_storages: tuple[int, ...] = ()


@dataclass(frozen=True)
class NonFiniteEvidence:
    """An optimiser step of a user's script at which a NaN or Inf showed on this rank: in
    the loss of its last backward, or in gradients its own backward produced (``local``,
    before any synchronisation)."""

    step: int  # 1-based count of the optimiser steps this rank took, this one included
    loss: float | None  # the last backward's loss, when it was a scalar
    loss_where: str  # the script's line that called backward()
    local: tuple[str, ...]  # parameters whose own gradient was non-finite
    where: str  # the script's line that called optimizer.step()

    @property
    def loss_finite(self) -> bool:
        return self.loss is None or math.isfinite(self.loss)


@dataclass(frozen=True)
class BufferEvidence:
    """A DDP model's floating-point buffers (BatchNorm's running statistics, any registered
    buffer) as a training forward of optimiser step ``step`` began, after DDP's own
    broadcast of rank 0's buffers (when it makes one): a few values of each, at the same
    positions on every rank."""

    step: int  # 1-based: the optimiser step this forward belongs to
    names: tuple[str, ...]
    values: tuple[tuple[float, ...], ...]  # per buffer, its sampled values
    where: str = ""  # the script's line that ran the forward


@dataclass(frozen=True)
class OptimizerEvidence:
    """One optimiser's settings in effect at step ``step``, written when they changed and
    on each sampled step, with (on sampled steps) its state and parameters sampled."""

    step: int  # 1-based count of the optimiser steps the rank took (any optimiser)
    optimizer: int  # which optimiser: numbered in the order the rank first stepped them
    params: int  # how many parameters it steps, and their elements: the same optimiser
    numel: int  # on every rank has the same
    settings: tuple[tuple[tuple[str, float], ...], ...]  # per parameter group, sorted
    state: tuple[tuple[str, tuple[float, ...]], ...] = ()  # per state entry, its samples
    sampled_params: tuple[float, ...] = ()  # the parameters at the same positions
    where: str = ""  # the line of optimizer.step()
    scheduled: str = ""  # the line of the last scheduler.step() before this step
    clipped: str = ""  # the line that clipped this step's gradients, if any did
    loaded: str = ""  # the line of this optimiser's last load_state_dict, if any
    built: str = ""  # the line that built this optimiser


@dataclass(frozen=True)
class SkippedStep:
    """A GradScaler's ``step()`` in a user's script that did not step the optimiser (its
    gradients held Inf or NaN: mixed precision's loss scale overflowed), after
    ``steps_before`` optimiser steps. The forwards before it were not applied: the next
    step's micro-batches start after it."""

    steps_before: int
    t: float  # when it returned (monotonic clock)


@dataclass(frozen=True)
class ClearedGradients:
    """A ``zero_grad()`` (an optimiser's or a module's) in a user's script that cleared
    the gradients a DDP model had accumulated in the current step, after ``steps_before``
    optimiser steps and before the next: the micro-batches before it are never applied."""

    steps_before: int
    t: float  # when it returned (monotonic clock)
    where: str  # the script's line that called it


@dataclass(frozen=True)
class DDPForward:
    """One forward of a DistributedDataParallel model in a user's script: whether its
    backward will all-reduce the gradients (off inside ``no_sync()``), and how many
    optimiser steps had run (the forwards between two steps are one step's micro-batches)."""

    steps_before: int
    sync: bool
    gradient_bytes: int  # bytes of the gradients one sync moves
    where: str
    t: float | None = None  # when it began (monotonic clock)
    # the in-place changes torch had counted on its first trainable parameter: alike for
    # a step's micro-batches, moved by anything that changed the weights between forwards
    version: int | None = None


@dataclass(frozen=True)
class BackwardEvidence:
    """Which parameters got a gradient, recorded before the step's first gradient sync.

    Emitted before the collective that a missing gradient would hang or break, so it
    reaches the parent even when that collective never returns.
    """

    step: int
    no_grad_params: tuple[str, ...]  # parameters that got no gradient from this rank's loss


@dataclass(frozen=True)
class RestartEvidence:
    """One rank's training state as it saved it and as it stood once it had loaded it back,
    per part, as digests: a resume is exact when every part reads back as it was saved.

    ``saved`` and ``restored`` map each part ("parameters", "optimizer state", "scheduler",
    "RNG state", "sampler") to a digest of its bytes; ``sampler`` is the loader's place
    (epoch, batches read in it) as saved and as restored, which says what was lost.
    """

    step: int  # the last step before the restart
    saved: tuple[tuple[str, str], ...]
    restored: tuple[tuple[str, str], ...]
    sampler_saved: tuple[int, int] = (0, 0)
    sampler_restored: tuple[int, int] = (0, 0)
    scheduler_saved: int = 0  # the scheduler's count of steps, as saved and as restored
    scheduler_restored: int = 0

    def parts_lost(self) -> tuple[str, ...]:
        """The parts whose restored digest is not the one saved, in the saved order."""
        restored = dict(self.restored)
        return tuple(part for part, digest in self.saved if restored.get(part) != digest)


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
    pg: str | None = None  # the group's name, unless the default group: same ranks, apart
    tag: int = 0  # a send's or receive's tag: a channel of its own, as gloo matches them
    # a reduction's: the storages of its tensors (which gradient or parameter it reduced:
    # replica groups by how the ranks communicate), and the optimiser steps done before it
    storages: tuple[int, ...] = ()
    step: int | None = None
    future: bool = False  # its Work was turned into a future (a DDP comm hook's): waited there

    @property
    def user_line(self) -> str:
        """The user's line the rank waits at: the wait's, for an asynchronous call."""
        return self.wait_where if self.async_op and self.wait_where else self.where

    def describe(self, relative: bool = False) -> str:
        """'send to 3 (#1, (2, 32, 16), float32) at train.py:52', at the user's line
        (``relative``: its path relative to the working directory, where it is under it)."""
        where = relative_line(self.user_line) if relative else self.user_line
        return describe_call(self.op, self.peer, self.seq, self.shapes, self.dtype,
                             self.reduce_op, self.pg, where)

    @property
    def blocking(self) -> bool:
        """Is the rank inside this call right now (entered a blocking call, or waiting)?"""
        if self.completed is not None or self.error is not None:
            return False
        return not self.async_op or self.waited is not None


@dataclass(frozen=True)
class Phase:
    """A span of a rank's main thread that says where its time went between collectives:
    waiting for a data loader's next batch (``loader``), a DDP forward (``forward``), a
    backward (``backward``, DDP's wait for its gradient all-reduce included), an optimiser
    step (``optimizer``). On the machine-wide monotonic clock; ``step`` counts the
    optimiser steps the rank had completed as it began (so it belongs to step ``step + 1``);
    ``where`` is the user's line that started it; ``cpu``, for an optimiser step, the main
    thread's seconds on a CPU and waiting for one (the kernel's run-queue delay) since it
    started, read as the step ended (None: not read)."""

    kind: str
    start: float
    end: float
    step: int
    where: str = ""
    cpu: tuple[float, float] | None = None


@dataclass(frozen=True)
class GapSample:
    """Where a rank's main thread was, sampled while it ran its own code (in no phase and
    no collective): the user's innermost line and function, the training loop's line that
    called into it (the loop: the function that steps the optimiser), and the time the
    samples of step ``step + 1`` (as Phase counts) found it there (their number times the
    period)."""

    step: int
    where: str
    function: str
    seconds: float
    via: str = ""  # the training loop's line that led there, when it is not that line


@dataclass(frozen=True)
class Arrival:
    """When a rank entered one collective, by torch's Flight Recorder: every collective of
    its process groups, DDP's and FSDP's own included, numbered on its group as the backend
    pairs them. ``at`` is on the rank's monotonic clock (the record's ``wall_offset`` turns
    it into wall-clock time, which machines share)."""

    pg: str | None  # the group's name; None: the default group
    group: tuple[int, ...]  # its global ranks
    seq: int
    op: str
    at: float


@dataclass(frozen=True)
class Incomplete:
    """Evidence a rank could not record from ``step`` on (a recorder raised; or trace
    events this version cannot read): the checks that read it may have missed something,
    and the report says so instead of a clean bill of health."""

    what: str  # "gradient samples", "the batches a loader drew", ...
    step: int | None  # the optimiser step it stops at, where known
    error: str  # "RuntimeError: ..." (or what was not understood)

    def __str__(self) -> str:
        step = f" from step {self.step}" if self.step is not None else ""
        return f"{self.what}{step}" + (f" ({self.error})" if self.error else "")


@dataclass(frozen=True)
class GroupTensor:
    """A tensor one rank of a tensor-parallel group held at one step, and what the group
    must hold of it: ``alike`` (every rank the same: a row-parallel layer's output after
    its all-reduce, a column-parallel layer's replicated input, a replicated parameter, a
    dropout mask on replicated activations) or
    not (each rank its own slice: a dropout mask on a column-parallel output, which must
    differ from the other slices' or the slices are not independent)."""

    step: int  # parameters: after this optimiser step; activations and masks: during it
    name: str  # the layer or parameter, e.g. "fc2" or "head.weight"
    kind: str  # "activation" | "input" | "parameter" | "mask" | "dropout-input" (what a
    # user's dropout on a slice was handed, at the mask's positions)
    alike: bool
    group: tuple[int, ...]  # the tensor-parallel group's ranks
    value: Fingerprint  # this rank's local tensor (a sample of it in users' scripts)
    where: str = ""  # the user's file:line, when known


# a dropout mask's sampled values in a user's run: kept, dropped, or unknown (the input
# there was zero, so whether it was dropped cannot be read from the output)
MASK_KEPT, MASK_DROPPED, MASK_UNKNOWN = 1.0, 0.0, -1.0


@dataclass(frozen=True)
class GroupTraffic:
    """Bytes one rank handed to one process group's collectives in one optimiser step, by
    what they were for: "tensor" (a tensor-parallel layer's all-reduces, in forward and
    backward) or "data" (the replicas' gradient average)."""

    step: int
    purpose: str
    group: tuple[int, ...]
    calls: int
    bytes: int


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
class Startup:
    """What a rank gave ``init_process_group`` and what its launcher set, and whether the
    call returned (the group formed). Values only: never the whole environment."""

    where: str  # the user's line that called it
    backend: str | None
    init_method: str | None  # scheme, host, port, path: no query string
    rank: int | None  # as passed; None: taken from the environment (RANK)
    world_size: int | None  # as passed; None: from the environment (WORLD_SIZE)
    env: tuple[tuple[str, str], ...]  # the launcher's variables (LAUNCHER_VARIABLES), as set
    store_given: bool = False  # a store object passed: its address is not ours to read
    joined: bool = False
    t: float = 0.0  # when it entered, on the machine's monotonic clock

    def variable(self, name: str) -> str | None:
        return dict(self.env).get(name)


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
    ddp_group: tuple[int, ...] = ()  # the ranks that DDP averages gradients over
    # the nn.Dropout layers of a user's parallelized model seen dropping (training, p > 0)
    dropouts: tuple[str, ...] = ()
    memory: tuple[MemoryEvidence, ...] = ()  # training state held, per step
    restarts: tuple[RestartEvidence, ...] = ()  # the built-in workload's checkpoint restarts
    batches: tuple[BatchEvidence, ...] = ()  # a user's script's loader batches, from the tracer
    gradients: tuple[GradientEvidence, ...] = ()  # a user's script's gradients per step
    ddp_forwards: tuple[DDPForward, ...] = ()  # a user's script's DDP forwards
    skipped: tuple[SkippedStep, ...] = ()  # a GradScaler's steps that did not step
    cleared: tuple[ClearedGradients, ...] = ()  # zero_grad() calls inside a step
    buffers: tuple[BufferEvidence, ...] = ()  # a user's DDP model's buffers, sampled
    optimizer: tuple[OptimizerEvidence, ...] = ()  # a user's optimisers' settings and state
    nonfinite: tuple[NonFiniteEvidence, ...] = ()  # a user's script's steps gone NaN/Inf
    group_tensors: tuple[GroupTensor, ...] = ()  # tensors a tensor-parallel group must
    # hold alike (or apart), per step
    traffic: tuple[GroupTraffic, ...] = ()  # collective bytes per step and purpose
    node: int = 0  # the machine this rank runs on (rank // ranks per node)
    incomplete: tuple[Incomplete, ...] = ()  # evidence a recorder could not keep
    phases: tuple[Phase, ...] = ()  # loader waits, forwards, backwards, optimiser steps
    gap_samples: tuple[GapSample, ...] = ()  # its own code's lines, sampled in long gaps
    arrivals: tuple[Arrival, ...] = ()  # when it entered each collective (Flight Recorder)
    startup: Startup | None = None  # its last init_process_group: arguments and return
    wall_offset: float | None = None  # wall-clock minus monotonic time on its machine
    # its threads' seconds on a CPU and waiting for one over the job (the kernel's)
    cpu_s: tuple[float, float] | None = None
