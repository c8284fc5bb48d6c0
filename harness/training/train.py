"""The training job a rank runs, recording evidence as it goes.

Evidence is emitted step by step, so a run that hangs or crashes at step 3 still hands
the detectors steps 1 and 2. The strategy owns synchronisation and the optimiser step;
the loop asks it for the same evidence whatever it shards: the gradient this rank
computed itself (caught by hooks as autograd produces it), the gradient applied and the
parameters in full, and the bytes of state it held. A rank whose state exceeds the
run's memory budget stops with out-of-memory, as it would on a device of that size.
"""

from __future__ import annotations

import contextlib
import time

import torch

from distdoctor.launch.rank import RankContext
from distdoctor.models import BackwardEvidence, MemoryEvidence, RunSpec, StepEvidence
from distdoctor.models.events import Emit
from distdoctor.training import strategies
from distdoctor.training.checkpoint import LoaderPlace, Resumable, restart
from distdoctor.training.fingerprint import fingerprint
from distdoctor.training.phases import record_phase
from distdoctor.training.workload import (
    batch_ids_at,
    build_model,
    jitter_seed,
    jittered,
    loss_fn,
    make_dataset,
    straggle,
)


def train_job(ctx: RankContext, spec: RunSpec) -> None:
    """Train ``spec.num_steps`` steps on this rank, emitting evidence as it goes.

    Emits ("built", Fingerprint) as the model is built, ("initial", Fingerprint) once the
    strategy has wrapped it, then per step ("backward", BackwardEvidence) before the
    step's first gradient sync, ("memory", MemoryEvidence) after the optimiser step and
    ("step", StepEvidence); ("restart", RestartEvidence) after the step the knobs restart
    the job at.
    """
    model = build_model(spec, ctx.rank)
    ctx.emit((Emit.BUILT, fingerprint(model.parameters(), spec.fingerprint_values)))
    sizes = [p.numel() for p in model.parameters()]
    owned = [sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()]
    layers, largest = sum(1 for n in owned if n), max(owned)
    dp = strategies.wrap(model, spec)
    x, y = make_dataset(spec)
    ctx.emit((Emit.INITIAL, fingerprint(dp.full_params(), spec.fingerprint_values)))
    budget = int(spec.knobs.memory_budget * sum(sizes))
    use_aux = spec.uses_aux(ctx.rank)
    k = spec.micro_batches
    if spec.knobs.input_jitter:
        torch.manual_seed(jitter_seed(spec, ctx.rank))
    knobs = spec.knobs
    place = LoaderPlace()
    state = Resumable(dp, spec, place) if knobs.restart_after or knobs.lr_decay != 1.0 \
        else None
    for step in range(1, spec.num_steps + 1):
        fetched = time.monotonic()
        epoch = place.epoch
        ids = batch_ids_at(spec, ctx.rank, epoch, place.within)
        inputs = jittered(spec, x[ids])
        place.advance(spec)
        straggle(spec, ctx.rank, "loader")
        record_phase(ctx, "loader", step, fetched)
        started = time.perf_counter()
        dp.zero_grad()
        dp.probe.reset()
        dp.comm.reset()
        report_backward = _once(lambda: ctx.emit((Emit.BACKWARD, BackwardEvidence(
            step=step, no_grad_params=dp.probe.missing()))))
        dp.comm.on_sync = report_backward
        loss_total = 0.0
        for i in range(k):
            rows = slice(i * len(ids) // k, (i + 1) * len(ids) // k)
            micro = ids[rows]
            skip_sync = spec.knobs.no_sync_accumulation and i < k - 1
            with dp.no_sync() if skip_sync else contextlib.nullcontext():
                began = time.monotonic()
                out, aux = dp(inputs[rows], use_aux=use_aux)
                loss = loss_fn(out, aux, y[micro]) / k
                record_phase(ctx, "forward", step, began)
                began = time.monotonic()
                loss.backward()
                if i == k - 1:
                    report_backward()
                dp.finish_backward()
                record_phase(ctx, "backward", step, began)
            loss_total += loss.item()
        began = time.monotonic()
        dp.step()
        if state is not None:
            state.scheduler.step()
        record_phase(ctx, "optimizer", step, began)
        seconds = time.perf_counter() - started
        straggle(spec, ctx.rank, "work")
        held = dp.held()
        memory = MemoryEvidence(
            step=step, stage=dp.stage, world_size=spec.world_size, params=held.params,
            grads=held.grads, optimizer=held.optimizer, gathered=held.gathered, budget=budget,
            model_params=sum(sizes), largest_layer=largest, layers=layers,
            optimizer_tensors=dp.optimizer_tensors)
        ctx.emit((Emit.MEMORY, memory))
        if budget and memory.total > budget:
            raise torch.OutOfMemoryError(
                f"out of memory: training state {memory.total} bytes over the budget of "
                f"{budget} (params {memory.params}, grads {memory.grads}, "
                f"optimiser {memory.optimizer}, gathered {memory.gathered})")
        ctx.emit((Emit.STEP, StepEvidence(
            step=step,
            epoch=epoch,
            sample_ids=tuple(ids),
            loss=loss_total,
            params=fingerprint(dp.full_params(), spec.fingerprint_values),
            grad_local=fingerprint(dp.probe.gradients(), spec.fingerprint_values),
            grad_synced=fingerprint(dp.full_grads(), spec.fingerprint_values),
            allreduce_calls=dp.comm.calls,
            allreduce_bytes=dp.comm.bytes,
            gradient_bytes=dp.gradient_bytes,
            seconds=seconds,
        )))
        if state is not None and step == knobs.restart_after:
            ctx.emit((Emit.RESTART, restart(state, ctx.rank, step)))


def _once(action):
    done = False

    def run_once() -> None:
        nonlocal done
        if not done:
            done = True
            action()
    return run_once
