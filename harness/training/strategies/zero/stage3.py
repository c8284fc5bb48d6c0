"""Hand-rolled ZeRO-3: parameters sharded too, each layer gathered only while it runs.

Every layer is replaced by a :class:`ShardedLayer` that holds only this rank's slice of
the layer's flat buffer. Its forward all-gathers the layer, runs it and frees the gathered
buffer (nothing but the layer's input is kept for backward); its backward all-gathers the
layer again, recomputes the layer's forward to differentiate it, reduce-scatters the
layer's gradient at once and frees everything but this rank's gradient shard. At any
moment a rank holds its shards plus one gathered layer (and that layer's gradient).

Inside ``no_sync`` the layer's unsharded gradient is kept and added to the next synced
micro-batch's, as FSDP does when gradient synchronisation is turned off: accumulation
without the per-micro-batch reduce-scatter costs a full gradient of memory.

Because a layer's forward is itself a collective, a layer that some ranks skip leaves the
ranks' all-gathers mismatched: ZeRO-3 cannot run a model whose ranks use different layers.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call

from distdoctor.models import RunSpec
from distdoctor.trace.memory import optimizer_state, storage_bytes
from distdoctor.training.strategies.base import (
    GradProbe,
    HeldBytes,
    ManualSync,
    SyncLog,
    broadcast_from_rank0,
    nbytes,
)
from distdoctor.training.strategies.zero.layout import Layer, gather_views, layers_of
from distdoctor.training.workload import make_optimizer


class Gathered:
    """Buffers gathered right now, and the peak of their bytes held at once."""

    def __init__(self) -> None:
        self.live: list[torch.Tensor] = []
        self.peak = 0

    def hold(self, *tensors: torch.Tensor) -> None:
        self.live.extend(tensors)
        self.peak = max(self.peak, storage_bytes(self.live))

    def free(self, tensor: torch.Tensor) -> None:
        tensor.untyped_storage().resize_(0)  # gone now, whoever still refers to it
        self.live = [t for t in self.live if t is not tensor]


class ShardedLayer(nn.Module):
    # kept in __dict__, not as submodules (their placeholders are not state): declared
    # here so that reading them is typed, not nn.Module.__getattr__'s Tensor | Module
    inner: nn.Module
    owner: Zero3

    def __init__(self, layer: Layer, module: nn.Module, owner: Zero3):
        super().__init__()
        self.layer = layer
        flat = layer.flatten(list(module.parameters(recurse=False)))
        self.shard = nn.Parameter(flat[layer.own].clone())
        self.local_names = tuple(n for n, _ in module.named_parameters(recurse=False))
        for name in self.local_names:  # the module keeps its code, not its parameters
            setattr(module, name, nn.Parameter(torch.empty(0), requires_grad=False))
        self.__dict__["inner"] = module  # not a submodule: its placeholders are not state
        self.__dict__["owner"] = owner
        self.pending: torch.Tensor | None = None  # unsharded gradient kept by no_sync

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _GatheredCall.apply(x, self.shard, self)

    def run(self, full: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        params = dict(zip(self.local_names, self.layer.views(full)))
        return functional_call(self.inner, params, (x,))

    def backward(self, x: torch.Tensor, grad_out: torch.Tensor):
        owner, layer = self.owner, self.layer
        full = layer.gather(self.shard)
        owner.gathered.hold(full)
        with torch.enable_grad():
            params = [v.detach().requires_grad_() for v in layer.views(full)]
            inputs = x.detach().requires_grad_(x.requires_grad)
            out = functional_call(self.inner, dict(zip(self.local_names, params)), (inputs,))
            wrt = ([inputs] if x.requires_grad else []) + params
            grads = list(torch.autograd.grad(out, wrt, grad_out, allow_unused=True))
        grad_x = grads.pop(0) if x.requires_grad else None
        for name, grad in zip(layer.names, grads):
            if grad is not None:
                owner.probe.add(name, grad)
        local = layer.flatten(grads)
        owner.gathered.hold(local)
        owner.gathered.free(full)
        if self.pending is not None:
            local.add_(self.pending)
            self.pending = None
        if not owner.syncing:
            self.pending = local
            owner.gathered.live = [t for t in owner.gathered.live if t is not local]
            return grad_x, None
        shard = torch.empty(layer.shard_numel)
        owner.comm.count(nbytes(local))
        dist.reduce_scatter_tensor(shard, local, op=dist.ReduceOp.SUM)
        if owner.average:
            shard.div_(layer.world_size)
        owner.gathered.free(local)
        return grad_x, shard


class _GatheredCall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, shard: torch.Tensor, layer: ShardedLayer):
        ctx.layer = layer
        ctx.save_for_backward(x)
        full = layer.layer.gather(shard)
        layer.owner.gathered.hold(full)
        try:
            return layer.run(full, x)
        finally:
            layer.owner.gathered.free(full)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (x,) = ctx.saved_tensors
        grad_x, grad_shard = ctx.layer.backward(x, grad_out)
        return grad_x, grad_shard, None


class Zero3(ManualSync):
    stage = 3

    def __init__(self, module: nn.Module, spec: RunSpec):
        self.module = module
        self.comm = SyncLog()
        self.average = spec.knobs.average_gradients
        self.gathered = Gathered()
        if spec.knobs.broadcast_params_at_start:
            broadcast_from_rank0(module)
        self.probe = GradProbe((name, p.shape) for name, p in module.named_parameters())
        found = layers_of(module, dist.get_world_size(), dist.get_rank())
        if any(layer.path == "" for layer, _ in found):
            raise ValueError("zero3 shards layers: the model itself may not own parameters")
        self.sharded = []
        for layer, inner in found:
            parent_path, _, child = layer.path.rpartition(".")
            parent = module.get_submodule(parent_path)
            sharded = ShardedLayer(layer, inner, self)
            setattr(parent, child, sharded)
            self.sharded.append(sharded)
        shards = [s.shard for s in self.sharded]
        self.optimizer = make_optimizer(shards, spec)
        self.optimizer_tensors = len(shards)
        self.gradient_bytes = 4 * sum(s.layer.padded for s in self.sharded)

    def finish_backward(self) -> None:
        pass  # each layer reduce-scattered its gradient as its backward ended

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        for sharded in self.sharded:
            sharded.pending = None
        self.gathered = Gathered()

    def step(self) -> None:
        self.optimizer.step()

    def full_params(self) -> list[torch.Tensor]:
        return gather_views([s.layer for s in self.sharded], [s.shard for s in self.sharded])

    def full_grads(self) -> list[torch.Tensor]:
        shards = [s.shard.grad if s.shard.grad is not None else torch.zeros_like(s.shard)
                  for s in self.sharded]
        return gather_views([s.layer for s in self.sharded], shards)

    def held(self) -> HeldBytes:
        shards = [s.shard for s in self.sharded]
        grads = [s.grad for s in shards] + [s.pending for s in self.sharded]
        return HeldBytes(storage_bytes(shards), storage_bytes(grads),
                         storage_bytes(optimizer_state(self.optimizer)), self.gathered.peak)
