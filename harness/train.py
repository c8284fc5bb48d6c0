"""The training job a rank runs, recording evidence as it goes.

Evidence is emitted step by step, so a run that hangs or crashes at step 3 still hands
the detectors steps 1 and 2. The gradient a rank computed itself is caught by a
post-accumulate hook (DDP overwrites ``.grad`` with the synchronised one only after
backward), which works the same for every strategy.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from harness import strategies
from harness.fingerprint import fingerprint
from harness.models import BackwardEvidence, RunSpec, StepEvidence
from harness.rank import RankContext
from harness.workload import batch_ids, build_model, epoch_of, loss_fn, make_dataset


class GradProbe:
    """Which parameters autograd gave a gradient this step, and what it was locally."""

    def __init__(self, model: nn.Module):
        self.names = [name for name, _ in model.named_parameters()]
        self.local: dict[str, torch.Tensor] = {}
        for name, p in model.named_parameters():
            p.register_post_accumulate_grad_hook(self._hook(name))

    def _hook(self, name: str):
        def record(p: torch.Tensor) -> None:
            self.local[name] = p.grad.detach().clone()
        return record

    def reset(self) -> None:
        self.local = {}

    def missing(self) -> tuple[str, ...]:
        return tuple(n for n in self.names if n not in self.local)


def train_job(ctx: RankContext, spec: RunSpec) -> None:
    """Train ``spec.num_steps`` steps on this rank, emitting evidence as it goes.

    Emits ("built", Fingerprint) as the model is built, ("initial", Fingerprint) once the
    strategy has wrapped it, then per step ("backward", BackwardEvidence) before the
    step's first gradient sync and ("step", StepEvidence) after the optimiser step.
    """
    model = build_model(spec, ctx.rank)
    ctx.emit(("built", fingerprint(model.parameters(), spec.fingerprint_values)))
    dp = strategies.wrap(model, spec)
    probe = GradProbe(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=spec.lr)
    x, y = make_dataset(spec)
    params = list(model.parameters())
    gradient_bytes = sum(p.numel() * p.element_size() for p in params)
    ctx.emit(("initial", fingerprint(params, spec.fingerprint_values)))
    use_aux = spec.uses_aux(ctx.rank)
    k = spec.micro_batches
    for step in range(1, spec.num_steps + 1):
        ids = batch_ids(spec, ctx.rank, step)
        optimizer.zero_grad(set_to_none=True)
        probe.reset()
        dp.comm.reset()
        report_backward = _once(lambda: ctx.emit(("backward", BackwardEvidence(
            step=step, no_grad_params=probe.missing()))))
        dp.comm.on_sync = report_backward
        loss_total = 0.0
        for i in range(k):
            micro = ids[i * len(ids) // k: (i + 1) * len(ids) // k]
            skip_sync = spec.knobs.no_sync_accumulation and i < k - 1
            with dp.no_sync() if skip_sync else contextlib.nullcontext():
                out, aux = dp(x[micro], use_aux=use_aux)
                loss = loss_fn(out, aux, y[micro]) / k
                loss.backward()
                if i == k - 1:
                    report_backward()
                dp.finish_backward()
            loss_total += loss.item()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        local = [probe.local.get(n, torch.zeros_like(p)) for n, p in zip(probe.names, params)]
        synced = fingerprint(grads, spec.fingerprint_values)
        optimizer.step()
        ctx.emit(("step", StepEvidence(
            step=step,
            epoch=epoch_of(spec, step),
            sample_ids=tuple(ids),
            loss=loss_total,
            params=fingerprint(params, spec.fingerprint_values),
            grad_local=fingerprint(local, spec.fingerprint_values),
            grad_synced=synced,
            allreduce_calls=dp.comm.calls,
            allreduce_bytes=dp.comm.bytes,
            gradient_bytes=gradient_bytes,
        )))


def _once(action):
    done = False

    def run_once() -> None:
        nonlocal done
        if not done:
            done = True
            action()
    return run_once
