"""Hand-rolled ZeRO-1 and ZeRO-2: every rank holds the whole model, the optimiser state
is sharded, and (ZeRO-2) so is the gradient once it is reduced.

One step: backward leaves each rank its local gradient; one reduce-scatter per bucket of
layers hands every rank the sum over ranks of its own shard of each layer (divided by N);
the optimiser steps those shards only, in place in the layers' flat parameter buffers;
one all-gather per bucket gives every rank the updated parameters back. ZeRO-1 keeps the
full gradient in a flat buffer per layer (the parameters' ``.grad`` are views of it) and
writes its reduced shard into its own slice; ZeRO-2 frees the full gradient as soon as
its bucket is reduced and keeps only the shard. The synchronisation runs after backward,
so a parameter without a gradient is caught and named before any rank enters the
collective.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from distdoctor.models import RunSpec
from distdoctor.trace.memory import optimizer_state, storage_bytes
from distdoctor.training.strategies.base import (
    GradProbe,
    HeldBytes,
    ManualSync,
    SyncLog,
    broadcast_from_rank0,
)
from distdoctor.training.strategies.zero.bucket import buckets_of
from distdoctor.training.strategies.zero.layout import gather_views, layers_of
from distdoctor.training.workload import make_optimizer


class ShardedOptimizer(ManualSync):
    stage: int

    def __init__(self, module: nn.Module, spec: RunSpec):
        self.module = module
        self.comm = SyncLog()
        self._knobs = spec.knobs
        self.world_size = dist.get_world_size()
        if self._knobs.broadcast_params_at_start:
            broadcast_from_rank0(module)
        self.layers = layers_of(module, self.world_size, dist.get_rank())
        self.buckets = buckets_of([layer for layer, _ in self.layers])
        self.probe = GradProbe.on(module)
        self.flat_params = []
        for layer, owner in self.layers:
            params = list(owner.parameters(recurse=False))
            flat = layer.flatten(params)
            for p, view in zip(params, layer.views(flat)):
                p.data = view  # the model computes with views of the flat buffer
            self.flat_params.append(flat)
        self.flat_grads = [torch.zeros_like(flat) for flat in self.flat_params] \
            if self.stage == 1 else []
        self._attach_grad_views()
        # the optimiser's parameters are views of this rank's slices: stepping them
        # updates the flat buffers in place
        self.shards = [nn.Parameter(flat[layer.own])
                       for (layer, _), flat in zip(self.layers, self.flat_params)]
        self.reduced: list[torch.Tensor | None] = [None] * len(self.layers)
        self.optimizer = make_optimizer(self.shards, spec)
        self.optimizer_tensors = len(self.shards)
        self.gradient_bytes = 4 * sum(layer.padded for layer, _ in self.layers)

    def _attach_grad_views(self) -> None:
        for (layer, owner), flat in zip(self.layers, self.flat_grads):
            for p, view in zip(owner.parameters(recurse=False), layer.views(flat)):
                p.grad = view

    def finish_backward(self) -> None:
        if self.syncing:
            self.reduce_scatter_gradients()

    def reduce_scatter_gradients(self) -> None:
        """Each layer's local gradient, reduce-scattered a bucket at a time: this rank keeps
        the mean of its own shard of every layer."""
        self.require_gradients(self._knobs.find_unused_parameters, "reduce-scatter")
        for bucket in self.buckets:  # in the order backward finishes the layers
            self.comm.add(4 * sum(layer.padded for layer in bucket.layers))
            if self.stage == 1:
                shard = bucket.reduce_scatter(self.flat_grads[i] for i in bucket.indices)
            else:
                shard = bucket.reduce_scatter(self._take_full_grads(bucket))
            if self._knobs.average_gradients:
                shard.div_(self.world_size)
            for index, piece in zip(bucket.indices, bucket.split(shard)):
                held = self.reduced[index]
                self.reduced[index] = piece if held is None else held.add_(piece)
            if self.stage == 1:
                for index in bucket.indices:  # the next micro-batch (if synced) starts afresh
                    self.flat_grads[index].zero_()

    def _take_full_grads(self, bucket):
        """ZeRO-2: each layer's full gradient, flattened, then dropped from the parameters:
        once packed for the reduce-scatter, only the reduced shard is kept."""
        for index in bucket.indices:
            layer, owner = self.layers[index]
            params = list(owner.parameters(recurse=False))
            flat = layer.flatten([p.grad for p in params])
            for p in params:
                p.grad = None
            yield flat

    def zero_grad(self) -> None:
        for shard in self.shards:
            shard.grad = None
        self.reduced = [None] * len(self.layers)
        if self.stage == 1:
            for flat in self.flat_grads:
                flat.zero_()
        else:
            for p in self.module.parameters():
                p.grad = None

    def step(self) -> None:
        for index, ((layer, _), shard) in enumerate(zip(self.layers, self.shards)):
            reduced = self.reduced[index]
            if reduced is not None and self.stage == 1:
                own = self.flat_grads[index][layer.own]
                own.copy_(reduced)  # ZeRO-1 holds the reduced shard in its gradient buffer
                reduced = self.reduced[index] = own
            shard.grad = reduced
        self.optimizer.step()
        for bucket in self.buckets:
            bucket.all_gather([self.flat_params[index] for index in bucket.indices])

    def full_params(self) -> list[torch.Tensor]:
        return [p.detach() for p in self.module.parameters()]

    def full_grads(self) -> list[torch.Tensor]:
        shards = [reduced if reduced is not None else torch.zeros(layer.shard_numel)
                  for (layer, _), reduced in zip(self.layers, self.reduced)]
        return gather_views([layer for layer, _ in self.layers], shards)

    def held(self) -> HeldBytes:
        grads = self.flat_grads + self.reduced + [p.grad for p in self.module.parameters()]
        return HeldBytes(storage_bytes(self.flat_params), storage_bytes(grads),
                         storage_bytes(optimizer_state(self.optimizer)))


class Zero1(ShardedOptimizer):
    stage = 1


class Zero2(ShardedOptimizer):
    stage = 2
