"""The rank job of the tensor-parallel strategies: the built-in MLP cut over each
tensor-parallel group, every rank of a group on the same batch, the replicas (one per
group) averaging their gradients as data parallelism does.

Evidence is the data-parallel loop's: per step the loss, the sample ids, and fingerprints
of the whole model's parameters and gradients, put back together from the group's slices
on every rank (so the ranks of a group, and all replicas, must agree, and the reference
compares as it does for DDP). ``holds`` says which slice a rank holds: ranks holding the
same slice are the replicas that must read disjoint samples. Beside it, what only tensor
parallelism has: the tensors a group must hold alike (fc2's output, the replicated
parameters, the dropout mask on replicated activations) or apart (the mask on fc1's
slices), the bytes each group's collectives moved, and the node each rank runs on.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from distdoctor.models import GroupTensor, GroupTraffic, RunSpec, StepEvidence
from distdoctor.models.events import Emit
from distdoctor.tensor.layers import local_copy
from distdoctor.tensor.mlp import REPLICATED, SPLIT, TensorParallelMLP
from distdoctor.tensor.steps import torch_tp
from distdoctor.training.dropout import mask
from distdoctor.training.fingerprint import fingerprint
from distdoctor.training.phases import record_phase
from distdoctor.training.workload import batch_ids, build_model, epoch_of, loss_fn, make_dataset


def tensor_job(ctx, spec: RunSpec) -> None:
    tp, knobs = spec.tp_degree, spec.knobs
    part = spec.tp_slice(ctx.rank)
    tp_ranks, dp_ranks = spec.tp_group(ctx.rank), spec.dp_group(ctx.rank)
    tp_group, dp_group = _groups(ctx.rank, spec)
    full = build_model(spec, tp_ranks[0])  # one init per replica, then cut
    ctx.emit((Emit.BUILT, fingerprint(full.parameters(), spec.fingerprint_values)))
    ctx.emit((Emit.NODE, spec.node_of(ctx.rank)))
    if spec.strategy == "torch-tp":
        model = torch_tp(full, ctx.world_size, partial_output=not knobs.tp_output_allreduce)
        model.fc2.register_forward_hook(lambda m, i, out: setattr(model, "row_output",
                                                                   local_copy(out)))
    else:
        reduce = ("rows" if knobs.sequence_parallel else
                  "sum" if knobs.tp_output_allreduce else "none")
        model = TensorParallelMLP(full, part, tp, tp_group, reduce)
    log = getattr(model, "log", None)
    ctx.emit((Emit.HOLDS, f"tensor slice {part} of {tp}"))
    ctx.emit((Emit.INITIAL, fingerprint(whole(model, tp_group, tp), spec.fingerprint_values)))
    optimizer = torch.optim.SGD(model.parameters(), lr=spec.learning_rate)
    x, y = make_dataset(spec)
    use_aux = spec.uses_aux(tp_ranks[0])
    k = spec.micro_batches
    rows = tp if knobs.sequence_parallel else 1  # sequence parallelism: a rank's rows

    def held(step, name, kind, alike, tensor):
        ctx.emit((Emit.GROUP_TENSOR, GroupTensor(step, name, kind, alike, tp_ranks,
                                              fingerprint([local_copy(tensor)],
                                                          spec.fingerprint_values))))

    for step in range(1, spec.num_steps + 1):
        ids = batch_ids(spec, ctx.rank, step)
        started = time.perf_counter()
        before = (sum(log.calls.values()), sum(log.bytes.values())) if log else (0, 0)
        optimizer.zero_grad(set_to_none=True)
        loss_total = 0.0
        for i in range(k):
            micro = ids[i * len(ids) // k: (i + 1) * len(ids) // k]
            masks = _masks(spec, step, micro, part) if knobs.dropout else None
            out, aux = (model(x[micro], use_aux=use_aux, masks=masks) if masks is not None
                        else model(x[micro], use_aux=use_aux))
            mine = len(micro) // rows
            target = y[micro][part * mine:(part + 1) * mine] if rows > 1 else y[micro]
            loss = loss_fn(out, aux, target) / (k * rows)
            loss.backward()
            loss_total += loss.item()
            if i == 0 and not knobs.sequence_parallel:
                held(step, "fc2", "activation", True, model.row_output)
            if i == 0 and masks is not None:
                held(step, "dropout after fc1", "mask", False, masks[0])
                held(step, "dropout after fc2", "mask", True, masks[1])
        if knobs.sequence_parallel:
            total = torch.tensor([loss_total])
            dist.all_reduce(total, group=tp_group)
            loss_total = float(total)
            if knobs.tp_sync_replicated_grads:
                named = dict(model.named_parameters())
                for name in REPLICATED:  # each rank's share of the rows' gradient
                    if named[name].grad is not None and log is not None:
                        log.all_reduce(named[name].grad, "backward", tp_group)
        local = whole(model, tp_group, tp, grads=True)
        calls, sent = _average(model, dp_group, spec.dp_degree)
        began = time.monotonic()
        optimizer.step()
        record_phase(ctx, "optimizer", step, began)
        seconds = time.perf_counter() - started
        grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        ctx.emit((Emit.STEP, StepEvidence(
            step=step, epoch=epoch_of(spec, step), sample_ids=tuple(ids), loss=loss_total,
            params=fingerprint(whole(model, tp_group, tp), spec.fingerprint_values),
            grad_local=fingerprint(local, spec.fingerprint_values),
            grad_synced=fingerprint(whole(model, tp_group, tp, grads=True),
                                    spec.fingerprint_values),
            allreduce_calls=calls, allreduce_bytes=sent, gradient_bytes=grad_bytes,
            seconds=seconds)))
        named = dict(model.named_parameters())
        for name in REPLICATED:
            held(step, name, "parameter", True, named[name].detach())
        if log:
            ctx.emit((Emit.TRAFFIC, GroupTraffic(step, "tensor", tp_ranks,
                                              sum(log.calls.values()) - before[0],
                                              sum(log.bytes.values()) - before[1])))
        ctx.emit((Emit.TRAFFIC, GroupTraffic(step, "data", dp_ranks, calls, sent)))


def _masks(spec: RunSpec, step: int, ids, part: int):
    """This rank's dropout masks: its slice of fc1's, and fc2's whole. Megatron's tracker
    draws fc1's from one state per slice (here: that slice's columns of one full mask) and
    fc2's from the state the group shares; "per-rank" draws both from the rank's own state,
    "same-for-slices" gives every slice the same columns."""
    rng = spec.knobs.tp_dropout_rng
    width = spec.hidden_features // spec.tp_degree
    stream = part + 1 if rng == "per-rank" else 0
    first = 0 if rng == "same-for-slices" else part * width
    return (mask(spec, step, ids, 0, stream)[:, first:first + width],
            mask(spec, step, ids, 1, stream))


def _groups(rank: int, spec: RunSpec):
    """This rank's tensor-parallel and data-parallel groups (None: the whole world). Every
    rank creates every group, in the same order, as torch requires."""
    if spec.tp_degree == spec.world_size:
        return None, None
    mine = {}
    tensor = sorted({spec.tp_group(r) for r in range(spec.world_size)})
    data = sorted({spec.dp_group(r) for r in range(spec.world_size)})
    for kind, members in [("tp", g) for g in tensor] + [("dp", g) for g in data]:
        group = dist.new_group(list(members))
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
