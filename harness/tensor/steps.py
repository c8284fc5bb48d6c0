"""A few training steps of the tensor-parallel MLP on one rank, every rank on the same
batches: what the tests compare with one process. ``kind`` "tp" is the layers written out
here; "torch-tp" is torch's ``parallelize_module`` with ColwiseParallel / RowwiseParallel on
a CPU device mesh."""

from __future__ import annotations

import torch

from distdoctor.models import RunSpec
from distdoctor.tensor.layers import local_copy
from distdoctor.tensor.mlp import TensorParallelMLP
from distdoctor.training.workload import build_model, loss_fn, make_dataset


def train_steps(ctx, kind: str, spec: RunSpec, steps: int, input_grad: bool = False) -> dict:
    """Parameters after ``steps`` SGD steps, the first step's gradients, each as this rank
    holds them (plain tensors), and the all-reduces the layers issued in the first step.
    ``input_grad``: the batch asks for its gradient, as a block's input does when layers
    below it train (the data alone does not, and autograd then skips the backward
    all-reduce of the first block's input gradient, as Megatron's first layer does)."""
    torch.manual_seed(spec.seed)
    full = build_model(spec, 0)  # the same init on every rank: one model, cut
    size = ctx.world_size
    if kind == "tp":
        model = TensorParallelMLP(full, ctx.rank, size)
    else:
        model = torch_tp(full, size)
    optimizer = torch.optim.SGD(model.parameters(), lr=spec.learning_rate)
    x, y = make_dataset(spec)
    grads, traffic = {}, None
    for step in range(steps):
        ids = list(range(step * spec.batch_size, (step + 1) * spec.batch_size))
        optimizer.zero_grad()
        out, aux = model(x[ids].requires_grad_(input_grad))
        loss_fn(out, aux, y[ids]).backward()
        if step == 0:
            grads = {n: local_copy(p.grad) for n, p in model.named_parameters()
                     if p.grad is not None}
            if kind == "tp":
                traffic = {"calls": dict(model.log.calls), "bytes": dict(model.log.bytes)}
        optimizer.step()
    return {"params": {n: local_copy(p) for n, p in model.named_parameters()}, "grads": grads,
            "traffic": traffic, "held": sum(local_copy(p).numel() * p.element_size()
                                           for p in model.parameters())}


def torch_tp(full, size: int, partial_output: bool = False):
    """``partial_output``: fc2's plan declares its output Partial, so torch never sums it
    and ``use_local_output`` hands each rank its own partial sum (a forgotten all-reduce,
    written as a plan)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (size,))
    row = RowwiseParallel(output_layouts=Partial() if partial_output else Replicate())
    return parallelize_module(full, mesh, {"fc1": ColwiseParallel(), "fc2": row})
