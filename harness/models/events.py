"""Every name a rank writes home, defined once: the tracer's JSON events (their ``ev``) and
the built-in rank jobs' records (the tag of ``ctx.emit((tag, payload))``).

Writers and readers both spell a kind through these constants, so a renamed kind breaks
at import, not silently in a reader that no longer matches. Readers meet kinds they do
not know in two ways: a record tag of our own rank jobs that no reader knows is a bug and
raises; a tracer event from a trace file (written by another version, or cut short) is
counted and reported as evidence that could not be read, never dropped without a word.
"""

from __future__ import annotations

from typing import Iterable


class Ev:
    """The tracer's JSON events, one line each: ``{"ev": KIND, ...}``."""

    # a call: entered, waited on (asynchronous calls), completed, raised
    ENTER = "enter"
    WAIT = "wait"
    DONE = "done"
    ERROR = "error"
    FUTURE = "future"  # an asynchronous call's Work turned into a future: its holder waits
    # DDP: its parameters' names at construction, each forward's sync and bytes
    DDP = "ddp"
    DDP_FORWARD = "ddp_forward"
    # a GradScaler's step that did not step the optimiser (gradients with Inf/NaN): the
    # DDP forwards before it are no micro-batches of the next step
    STEP_SKIPPED = "step_skipped"
    # a zero_grad() that cleared gradients a DDP model's backward had left in the current
    # optimiser step, before that step was taken: its micro-batches so far are lost
    GRADS_CLEARED = "grads_cleared"
    # sampled parameters before a step, gradients before and after their sync
    PARAMS = "params"
    GRADS = "grads"
    # a DataLoader's batch of sample ids, and the end of a pass over it
    BATCH = "batch"
    PASS_END = "pass_end"
    NONFINITE = "nonfinite"  # the first NaN/Inf a rank saw, in its loss or gradients
    BUFFERS = "buffers"  # a DDP model's buffers as a training forward begins, sampled
    OPTIMIZER = "optimizer"  # an optimiser's settings when they change, its state sampled
    TP_TENSOR = "tp_tensor"  # a tensor a tensor-parallel group must hold alike or apart
    DROPOUT = "dropout"  # an nn.Dropout of a parallelized model seen dropping (training, p>0)
    # a pipeline stage (torch.distributed.pipelining): its parameters and layers, and each
    # forward or backward of one micro-batch with its CPU time
    STAGE_HELD = "stage_held"
    STAGE_CALL = "stage_call"
    # where a rank's time goes: a loader wait, forward, backward or optimiser step; its own
    # code's lines sampled in long gaps, per step; when it entered each collective
    PHASE = "phase"
    GAP_SAMPLES = "gap_samples"
    ARRIVALS = "arrivals"
    # a user's rank: its start, its end, a stall (no call for a while)
    START = "start"
    # init_process_group entered (what the rank gave it, and what its launcher set) and
    # returned: a rank between the two is waiting for its group to form
    INIT = "init"
    JOINED = "joined"
    EXIT = "exit"
    STALLED = "stalled"
    MEMORY_HELD = "memory_held"  # a user's rank's training state in bytes, under a budget
    INCOMPLETE = "incomplete"  # a recorder failed: its evidence stops here (see below)
    # under resume-check (trace/resume.py): what a resume must restore, digested before
    # each step; each checkpoint saved and loaded, each RNG state set; a rank stopped
    STATE = "state"
    SAVE = "save"
    LOAD = "load"
    RNG = "rng"
    STOPPED = "stopped"


TRACE_EVENTS = frozenset(v for k, v in vars(Ev).items() if k.isupper())
CALL_EVENTS = (Ev.ENTER, Ev.WAIT, Ev.DONE, Ev.ERROR)  # what the live wait-for graph reads


class Emit:
    """The built-in rank jobs' records, ``ctx.emit((TAG, payload))``."""

    BUILT = "built"  # parameters' fingerprint as constructed
    INITIAL = "initial"  # ... once the strategy has wrapped (and synchronised) them
    BACKWARD = "backward"  # gradients right after the first backward
    STEP = "step"  # StepEvidence, per optimiser step
    MEMORY = "memory"  # MemoryEvidence: bytes of model state held
    RESTART = "restart"  # RestartEvidence: state saved, and as loaded back after a restart
    HOLDS = "holds"  # which part of the model the rank holds, in words
    NODE = "node"  # the node the rank sits on
    STAGE = "stage"  # StageCost: a pipeline stage's layers, parameters, FLOPs
    STAGE_EVENT = "stage_event"  # StageEvent: one forward or backward of a micro-batch
    PHASE = "phase"  # Phase: a loader wait, forward, backward or optimiser step of a step
    PIPE_STEP = "pipe_step"  # PipeStepEvidence, per pipeline step
    GROUP_TENSOR = "group_tensor"  # GroupTensor, tensor parallelism
    TRAFFIC = "traffic"  # GroupTraffic: bytes a group's collectives moved in a step
    # check-collective's jobs: a transport waiting on a peer, a call into the transport
    WAITING = "waiting"
    TRANSPORT_CALL = "transport-call"
    # the pytest plugin's jobs: a rank's output, and its test's outcome
    OUTPUT = "distdoctor.output"
    OUTCOME = "distdoctor.test"


EMITTED = frozenset(v for k, v in vars(Emit).items() if k.isupper())


def unknown_kinds(events: Iterable[dict]) -> dict[str, int]:
    """Tracer events of kinds this version does not know, with how many of each."""
    found: dict[str, int] = {}
    for event in events:
        kind = event.get("ev")
        if kind not in TRACE_EVENTS:
            found[str(kind)] = found.get(str(kind), 0) + 1
    return found
