"""torch FSDP2: ``fully_shard`` on every layer and the root, on a CPU device mesh.

``fsdp2`` frees each layer's gathered parameters after its forward and gathers them again
for backward (``reshard_after_forward=True``, FSDP's FULL_SHARD, ZeRO-3); ``fsdp2-grad-op``
keeps them from forward to the end of backward (``False``, SHARD_GRAD_OP, ZeRO-2-like:
fewer all-gathers, a full set of parameters at the peak).

Evidence comes through FSDP2's public hooks: a reduce-scatter of our own (FSDP2 lets a
module swap its reduce-scatter) counts the gradient traffic; tensor hooks on the unsharded
parameters, attached once FSDP has gathered them, catch this rank's own gradient before
FSDP reduces it and measure what is gathered at the peak.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from distdoctor.models import RunSpec
from distdoctor.training.strategies.base import (
    GradProbe,
    HeldBytes,
    SyncLog,
    broadcast_from_rank0,
    nbytes,
    optimizer_state,
    storage_bytes,
)
from distdoctor.training.workload import make_optimizer


class FSDP2:
    stage = 3
    reshard_after_forward = True

    def __init__(self, module: nn.Module, spec: RunSpec):
        self.module = module
        self.comm = SyncLog()
        n = dist.get_world_size()
        if spec.knobs.broadcast_params_at_start:
            broadcast_from_rank0(module)
        self.probe = GradProbe((name, p.shape) for name, p in module.named_parameters())
        # FSDP2 pads each parameter's first dimension to a multiple of N
        self.gradient_bytes = 4 * sum(math.ceil(p.shape[0] / n) * n * p[0].numel()
                                      for p in module.parameters())
        self.layers = [(path, m) for path, m in module.named_modules()
                       if path and any(True for _ in m.parameters(recurse=False))]
        mesh = init_device_mesh("cpu", (n,))
        for _, layer in self.layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=self.reshard_after_forward)
        fully_shard(module, mesh=mesh, reshard_after_forward=self.reshard_after_forward)
        counter = _CountingReduceScatter(self.comm)
        for fsdp in [module] + [layer for _, layer in self.layers]:
            fsdp.set_custom_reduce_scatter(counter)
            if not spec.knobs.average_gradients:  # gloo has no PREMUL_SUM: plain SUM, /1
                fsdp.set_force_sum_reduction_for_comms(True)
                fsdp.set_gradient_divide_factor(1.0)
        self._watched: set[int] = set()
        self.peak = 0
        for path, layer in self.layers:
            layer.register_forward_pre_hook(self._on_gathered(path))
        self.optimizer = make_optimizer(list(module.parameters()), spec)
        self.optimizer_tensors = sum(1 for _ in module.parameters())

    def _on_gathered(self, path: str):
        """Runs after FSDP's own pre-forward hook has gathered ``path``'s parameters."""
        def hook(layer: nn.Module, args: Any) -> None:
            for name, p in layer.named_parameters(recurse=False):
                if id(p) not in self._watched:
                    self._watched.add(id(p))
                    p.register_hook(self._on_grad(f"{path}.{name}"))
            self._measure()
        return hook

    def _on_grad(self, name: str):
        def hook(grad: torch.Tensor) -> None:
            self.probe.add(name, grad)
            self._measure(grad)
        return hook

    def _measure(self, *extra: torch.Tensor) -> None:
        unsharded = [p for _, layer in self.layers for p in layer.parameters(recurse=False)
                     if not hasattr(p, "to_local")]
        live = unsharded + [p.grad for p in unsharded if p.grad is not None] + list(extra)
        self.peak = max(self.peak, storage_bytes(live))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        module = cast(FSDPModule, self.module)
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)

    def finish_backward(self) -> None:
        pass  # FSDP reduce-scattered each layer's gradient inside backward

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.peak = 0

    def step(self) -> None:
        self.optimizer.step()

    def full_params(self) -> list[torch.Tensor]:
        params: list[Any] = list(self.module.parameters())  # DTensors, each a row shard
        return _gather_rows([p.to_local().detach() for p in params], [p.shape for p in params])

    def full_grads(self) -> list[torch.Tensor]:
        params: list[Any] = list(self.module.parameters())  # DTensors, each a row shard
        local = [p.grad.to_local() if p.grad is not None else torch.zeros_like(p.to_local())
                 for p in params]
        return _gather_rows(local, [p.shape for p in params])

    def held(self) -> HeldBytes:
        params = list(self.module.parameters())
        return HeldBytes(storage_bytes(params), storage_bytes(p.grad for p in params),
                         storage_bytes(optimizer_state(self.optimizer)), self.peak)


def _gather_rows(shards: list[torch.Tensor], shapes: list[torch.Size]) -> list[torch.Tensor]:
    """Every parameter in full from this rank's row shards, in one all-gather.

    ``full_tensor()`` is one collective per parameter, and on gloo each costs milliseconds:
    gathering the evidence that way took longer than the training steps it records. FSDP2
    shards rows as ``torch.chunk`` does (ceil(rows / N) per rank, the last ones short or
    empty), so each shard is padded to that many rows, all travel in one flat buffer, and
    each parameter is cut back out of every rank's part."""
    n = dist.get_world_size()
    rows = [math.ceil(shape[0] / n) for shape in shapes]
    widths = [r * math.prod(shape[1:]) for r, shape in zip(rows, shapes)]
    flat = torch.zeros(sum(widths))
    offset = 0
    for shard, width in zip(shards, widths):
        flat[offset:offset + shard.numel()] = shard.reshape(-1)
        offset += width
    gathered = torch.empty(n * flat.numel())
    dist.all_gather_single(gathered, flat)
    gathered = gathered.view(n, -1)
    full, offset = [], 0
    for r, width, shape in zip(rows, widths, shapes):
        parts = gathered[:, offset:offset + width].reshape(n * r, *shape[1:])
        full.append(parts[:shape[0]].clone())
        offset += width
    return full


class FSDP2GradOp(FSDP2):
    stage = 2
    reshard_after_forward = False


class _CountingReduceScatter:
    """FSDP2's reduce-scatter as FSDP2 itself issues it, counted first."""

    def __init__(self, comm: SyncLog):
        self.comm = comm

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group,
                 op, async_op: bool = False):
        self.comm.count(nbytes(input_tensor))
        return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group,
                                          async_op=async_op)
