"""The rank job of the tensor-parallel strategies: the built-in MLP cut over each
tensor-parallel group, every rank of a group on the same batch, the replicas (one per
group) averaging their gradients as data parallelism does.

Evidence is the data-parallel loop's: per step the loss, the sample ids, and fingerprints
of the whole model's parameters and gradients, put back together from the group's slices
on every rank (so the ranks of a group, and all replicas, must agree, and the reference
compares as it does for DDP). ``holds`` says which slice a rank holds: ranks holding the
same slice are the replicas that must read disjoint samples.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from harness.models import RunSpec, StepEvidence
from harness.tensor.mlp import SPLIT, TensorParallelMLP
from harness.tensor.steps import torch_tp
from harness.training.fingerprint import fingerprint
from harness.training.workload import batch_ids, build_model, epoch_of, loss_fn, make_dataset


def tensor_job(ctx, spec: RunSpec) -> None:
    tp, dp = spec.tp_degree, spec.dp_degree
    tp_group, dp_group = _groups(ctx.rank, ctx.world_size, tp)
    full = build_model(spec, ctx.rank - ctx.rank % tp)  # one init per replica, then cut
    ctx.emit(("built", fingerprint(full.parameters(), spec.fingerprint_values)))
    if spec.strategy == "torch-tp":
        model = torch_tp(full, ctx.world_size)
    else:
        model = TensorParallelMLP(full, ctx.rank % tp, tp, tp_group)
    ctx.emit(("holds", f"tensor slice {ctx.rank % tp} of {tp}"))
    ctx.emit(("initial", fingerprint(whole(model, tp_group, tp), spec.fingerprint_values)))
    optimizer = torch.optim.SGD(model.parameters(), lr=spec.learning_rate)
    x, y = make_dataset(spec)
    use_aux = spec.uses_aux(ctx.rank - ctx.rank % tp)
    k = spec.micro_batches
    for step in range(1, spec.num_steps + 1):
        ids = batch_ids(spec, ctx.rank, step)
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss_total = 0.0
        for i in range(k):
            micro = ids[i * len(ids) // k: (i + 1) * len(ids) // k]
            out, aux = model(x[micro], use_aux=use_aux)
            loss = loss_fn(out, aux, y[micro]) / k
            loss.backward()
            loss_total += loss.item()
        local = whole(model, tp_group, tp, grads=True)
        calls, sent = _average(model, dp_group, dp)
        optimizer.step()
        seconds = time.perf_counter() - started
        grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        ctx.emit(("step", StepEvidence(
            step=step, epoch=epoch_of(spec, step), sample_ids=tuple(ids), loss=loss_total,
            params=fingerprint(whole(model, tp_group, tp), spec.fingerprint_values),
            grad_local=fingerprint(local, spec.fingerprint_values),
            grad_synced=fingerprint(whole(model, tp_group, tp, grads=True),
                                    spec.fingerprint_values),
            allreduce_calls=calls, allreduce_bytes=sent, gradient_bytes=grad_bytes,
            seconds=seconds)))


def _groups(rank: int, world: int, tp: int):
    """This rank's tensor-parallel and data-parallel groups (None: the whole world). Every
    rank creates every group, in the same order, as torch requires."""
    if tp == world:
        return None, None
    mine = {}
    for kind, members in ([("tp", list(range(g * tp, (g + 1) * tp))) for g in range(world // tp)]
                          + [("dp", list(range(s, world, tp))) for s in range(tp)]):
        group = dist.new_group(members)
        if rank in members:
            mine[kind] = group
    return mine["tp"], mine["dp"]


def _average(model, group, replicas: int) -> tuple[int, int]:
    """Average each gradient over the replicas (the data-parallel part); the all-reduces
    and bytes handed to them."""
    if replicas == 1:
        return 0, 0
    calls = sent = 0
    for p in model.parameters():
        dist.all_reduce(p.grad, group=group)
        p.grad /= replicas
        calls, sent = calls + 1, sent + p.grad.numel() * p.grad.element_size()
    return calls, sent


def whole(model, group, tp: int, grads: bool = False) -> list[torch.Tensor]:
    """The whole model's parameters (or gradients) in the built model's order, each put
    back together from the group's slices: the same list on every rank of the group."""
    out = []
    for name, p in model.named_parameters():
        t = p.grad if grads else p
        if t is None:
            out.append(torch.zeros(tuple(p.shape)))
            continue
        t = t.detach()
        if hasattr(t, "full_tensor"):  # torch's DTensor gathers itself
            out.append(t.full_tensor())
            continue
        layer, _, kind = name.partition(".")
        split = SPLIT.get(layer)
        if tp == 1 or split is None or (split == "row" and kind == "bias"):
            out.append(t.clone())
            continue
        parts = [torch.empty_like(t) for _ in range(tp)]
        dist.all_gather(parts, t.contiguous(), group=group)
        out.append(torch.cat(parts, dim=0 if split == "column" else 1))
    return out

