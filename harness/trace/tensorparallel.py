"""What a user's tensor-parallel model shows through torch's DTensor placements: the
evidence for a forgotten all-reduce, for replicated parameters that drift apart, and for
activations the group must share that it draws apart (dropout on each rank's own RNG).

``parallelize_module`` is wrapped (once torch's tensor-parallel package is imported: it
costs half a second, so a script that never imports it never pays). Each row-parallel
Linear it makes (weight Shard(1) on a mesh dimension) gets a forward hook before torch's
own output hook, which sees the layer's raw output (a Partial DTensor), and one after,
which sees what the next layer is handed. When that has the raw output's shape, the plan
meant the output whole on every rank of the dimension (Replicate), so a sample of it is
recorded at the first forward of an optimiser step; a sequence-parallel plan (output
Shard) hands rows instead and is not judged. Each column-parallel Linear (weight Shard(0))
gets a forward pre-hook after torch's own input hook: when that hands the layer a DTensor
replicated on every mesh dimension, every rank of the group holds that input whole (its
gradient is all-reduced over the group), so a sample of it is recorded too. Before an
optimiser step, each parameter of a parallelized model that is not sharded (a DTensor
replicated on every dimension, or a plain tensor beside sharded ones) is sampled. All on
the steps the gradient recorder samples (the first 8, then every 32nd), so a long run pays
little. Checks compare the samples across the tensor-parallel group: the ranks must agree.

Dropout on a sharded activation is the other way round: each slice must be dropped at its
own positions. Each ``nn.Dropout`` (or subclass) of a parallelized model is watched at the
first forward of a sampled step; what it drops is read exactly (an input value that is
not zero and comes out zero), at positions sampled before the call (an in-place dropout
overwrites its input). Whether its input is a slice is what the layers say: a DTensor's
placements, else the last parallel Linear that ran before it in this forward (a
column-parallel output handed on as this rank's columns, or a row-parallel output handed
on as rows: sequence parallel, the dropout handed a tensor of that shape). Those masks are
recorded to be told apart, never alike, with the inputs sampled beside them: copies of a
whole tensor are not slices, whatever the layers suggested.
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from distdoctor.analysis.positions import spread_positions
from distdoctor.models.events import Ev
from distdoctor.models.evidence import MASK_DROPPED, MASK_KEPT, MASK_UNKNOWN
from distdoctor.trace.afterimport import after_import
from distdoctor.trace.gradients import sampled
from distdoctor.trace.steps import step_hooks
from distdoctor.trace.tracer import incomplete, user_line

PACKAGE = "torch.distributed.tensor.parallel"
SAMPLE = 64  # values per tensor
# mask positions per dropout: 256 of a mask that keeps 90% agree by chance with odds
# 0.82**256 = 1e-22 on one step, so identical slices are told on the first sampled step
MASK_SAMPLE = 256


def record_tensor_parallel(tracer: Any) -> None:
    # each parallelized model, weakly; the line that parallelized it; its tensor-parallel ranks
    models: list[tuple[weakref.ref, str, tuple[int, ...]]] = []

    def before_step(_params) -> None:
        step = tracer.optimizer_steps  # the parameters as the last step left them
        if not sampled(step + 1):
            return
        for ref, where, group in models:
            module = ref()
            if module is None or len(group) < 2:
                continue
            for name, p in module.named_parameters():
                if _replicated(p):
                    _write(tracer, step, name, "parameter", group, _local(p), where)

    depth = [0]

    def wrap(package) -> None:
        original = package.parallelize_module
        if getattr(original, "_distdoctor", False):
            return

        def parallelize_module(module, device_mesh=None, parallelize_plan=None, *a, **kw):
            depth[0] += 1  # torch applies a plan by calling itself on each submodule
            try:
                out = original(module, device_mesh, parallelize_plan, *a, **kw)
            finally:
                depth[0] -= 1
            if depth[0]:
                return out
            try:  # evidence is best effort: never break the user's plan
                where = user_line()
                models.append((weakref.ref(out), where, _tp_group(out)))
                layers = _parallel_linears(out)
                for layer in layers:
                    if layer.column:
                        _hook_input(tracer, layer.module, layer.name, layer.group, where)
                    else:
                        _hook_output(tracer, layer, where)
                _hook_dropouts(tracer, out, layers, where)
            except Exception as exc:  # noqa: BLE001 (reported as incomplete evidence, below)
                incomplete("tensor-parallel samples", exc)
            return out

        setattr(parallelize_module, "_distdoctor", True)  # noqa: B010 (wrapped once)
        package.parallelize_module = parallelize_module
        api = sys.modules.get(PACKAGE + ".api")
        if api is not None:
            setattr(api, "parallelize_module", parallelize_module)  # noqa: B010

    step_hooks(tracer).before_step.append(("tensor-parallel samples", before_step))
    after_import(PACKAGE, wrap, "tensor-parallel samples")


@dataclass(frozen=True)
class _ParallelLinear:
    """A Linear the plan split: its outputs (column-parallel) or its inputs (row-parallel),
    over the ranks of ``group``. A row-parallel one's ``computed`` holds what it computed
    before torch's output hook turned that into what the next layer is handed: the local
    shape, and whether it was a DTensor (a Partial one, in a plan's row-parallel Linear)."""

    name: str
    module: Any
    column: bool
    group: tuple[int, ...]
    computed: dict[str, Any]


def _parallel_linears(model) -> list[_ParallelLinear]:
    """Each Linear of ``model`` split over a mesh dimension, once for each way it is (a
    2-D mesh may split one both ways), a row-parallel one's computed output kept by one
    hook before torch's own."""
    found = []
    for name, sub in model.named_modules():
        for dims, column in (((0, -2), True), ((1, -1), False)):
            dim = _sharded_dim(sub, dims)
            if dim is not None:
                found.append(_ParallelLinear(name, sub, column, _dim_group(sub.weight, dim),
                                             {} if column else _keep_computed(sub)))
    return found


def _keep_computed(module) -> dict[str, Any]:
    computed: dict[str, Any] = {"shape": None, "dtensor": False}

    def keep(_mod, _inputs, output):
        computed["shape"] = tuple(_local(output).shape) if isinstance(output, torch.Tensor) \
            else None
        computed["dtensor"] = hasattr(output, "to_local")

    module.register_forward_hook(keep, prepend=True)
    return computed


def _hook_output(tracer, layer: _ParallelLinear, where: str) -> None:
    """A row-parallel Linear's output, where it is handed on whole: its shape is what
    the layer computed (a sequence-parallel plan hands rows instead, not judged)."""
    seen = {"step": -1}

    def handed(_mod, _inputs, output):
        step = tracer.optimizer_steps + 1
        if step == seen["step"] or not sampled(step) or not isinstance(output, torch.Tensor) \
                or len(layer.group) < 2:
            return
        if not layer.computed["dtensor"] or tuple(output.shape) != layer.computed["shape"] \
                or hasattr(output, "to_local"):
            return  # rows (sequence parallel), or a DTensor the user keeps: not judged
        seen["step"] = step
        _write(tracer, step, layer.name, "activation", layer.group, output, where)

    layer.module.register_forward_hook(handed)


def _hook_input(tracer, module, name: str, group: tuple[int, ...], where: str) -> None:
    seen = {"step": -1}

    def handed(_mod, inputs):
        step = tracer.optimizer_steps + 1
        if step == seen["step"] or not sampled(step) or len(group) < 2 or not inputs:
            return
        x = inputs[0]
        placements = getattr(x, "placements", None)
        if not placements or not all(p.is_replicate() for p in placements):
            return  # a plain tensor the user keeps, or one still sharded: not judged
        seen["step"] = step
        _write(tracer, step, name, "input", group, x.to_local(), where)

    module.register_forward_pre_hook(handed)  # after torch's: sees what the layer is handed


def _hook_dropouts(tracer, model, layers: list[_ParallelLinear], where: str) -> None:
    """Record what each dropout of ``model`` drops where its input is a slice (see the
    module's docstring), on the first forward of each sampled step."""
    dropouts = [(name, sub) for name, sub in model.named_modules()
                if isinstance(sub, torch.nn.modules.dropout._DropoutNd)]
    if not dropouts:
        return
    # what the last parallel Linear of this forward handed on: a slice or not, of which
    # group, in which shape
    last: dict[str, Any] = {"sliced": None, "group": (), "shape": None}

    def forward_begins(_mod, _inputs):
        last["sliced"] = None

    model.register_forward_pre_hook(forward_begins)
    for layer in layers:
        _track_layout(tracer, layer, last)
    for name, sub in dropouts:
        _hook_dropout(tracer, sub, name, where, last)


def _track_layout(tracer, layer: _ParallelLinear, last: dict) -> None:
    """Keep in ``last`` whether the parallel Linear hands on a slice: a column-parallel
    output of its own columns, a row-parallel output not of the shape it computed (rows:
    sequence parallel), a DTensor sharded anywhere."""
    weight = layer.module.weight

    def handed(_mod, _inputs, output):
        if not sampled(tracer.optimizer_steps + 1) or not isinstance(output, torch.Tensor):
            return
        placements = getattr(output, "placements", None)
        if placements is not None:
            sliced = any(p.is_shard() for p in placements)
        elif layer.column:
            sliced = output.shape[-1] == _local(weight).shape[0] \
                and weight.shape[0] != _local(weight).shape[0]
        else:
            sliced = tuple(output.shape) != layer.computed["shape"]
        last["sliced"], last["group"], last["shape"] = sliced, layer.group, tuple(output.shape)

    layer.module.register_forward_hook(handed)


def _hook_dropout(tracer, module, name: str, where: str, last: dict) -> None:
    seen: dict[str, Any] = {"step": -1, "at": None, "before": None, "group": (),
                            "told": False}

    def before(_mod, inputs):
        step = tracer.optimizer_steps + 1
        seen["at"] = None
        if step == seen["step"] or not sampled(step) or not module.training \
                or not module.p or not inputs or not isinstance(inputs[0], torch.Tensor):
            return
        if not seen["told"]:  # that it drops at all, once: the task may keep it
            seen["told"] = True
            tracer.write(ev=Ev.DROPOUT, step=step, name=name, p=float(module.p))
        x = inputs[0]
        placements = getattr(x, "placements", None)
        # by the layers, only what has the shape the last one handed on (an elementwise
        # op's output): a whole tensor beside it, the block's input, is not its slice
        sliced = any(p.is_shard() for p in placements) if placements is not None \
            else last["sliced"] and tuple(x.shape) == last["shape"]
        if not sliced or len(last["group"]) < 2:
            return  # a whole activation (the check reads what comes of it), or unknown
        flat = _local(x).detach().reshape(-1)
        if flat.numel() == 0:
            return
        seen["at"] = torch.tensor(spread_positions(flat.numel(), MASK_SAMPLE))
        seen["before"], seen["group"] = flat[seen["at"]].clone(), last["group"]

    def after(_mod, _inputs, output):
        at = seen["at"]
        if at is None or not isinstance(output, torch.Tensor):
            return
        seen["at"] = None
        step = tracer.optimizer_steps + 1
        seen["step"] = step
        out = _local(output).detach().reshape(-1)[at]
        values = [MASK_KEPT if o != 0 else MASK_DROPPED if i != 0 else MASK_UNKNOWN
                  for i, o in zip(seen["before"].tolist(), out.tolist())]
        numel, group = _local(output).numel(), list(seen["group"])
        tracer.write(ev=Ev.TP_TENSOR, step=step, name=name, kind="mask", alike=False,
                     group=group, values=values, numel=numel, where=where)
        # what it was handed there: slices differ, copies of one whole tensor do not
        tracer.write(ev=Ev.TP_TENSOR, step=step, name=name, kind="dropout-input",
                     alike=False, group=group, values=seen["before"].to(torch.float64).tolist(),
                     numel=numel, where=where)

    module.register_forward_pre_hook(before)
    module.register_forward_hook(after)


def _sharded_dim(module, dims: tuple[int, int]) -> int | None:
    """The mesh dimension a Linear's weight is split on along tensor dimension ``dims``
    ((1, -1): its inputs, row-parallel; (0, -2): its outputs, column-parallel)."""
    weight = getattr(module, "weight", None)
    if weight is None or not isinstance(module, torch.nn.Linear) \
            or not hasattr(weight, "placements"):
        return None
    for dim, placement in enumerate(weight.placements):
        if placement.is_shard() and placement.dim in dims:
            return dim
    return None


def _dim_group(p, dim: int) -> tuple[int, ...]:
    mesh = p.device_mesh
    if mesh.ndim == 1:
        return tuple(int(r) for r in mesh.mesh.flatten().tolist())
    return tuple(dist.get_process_group_ranks(mesh.get_group(dim)))


def _tp_group(module) -> tuple[int, ...]:
    """The ranks along the first mesh dimension some parameter is sharded on."""
    for p in module.parameters():
        for dim, placement in enumerate(getattr(p, "placements", ())):
            if placement.is_shard():
                return _dim_group(p, dim)
    return ()


def _replicated(p) -> bool:
    placements = getattr(p, "placements", None)
    if placements is None:
        return p.requires_grad
    return all(placement.is_replicate() for placement in placements)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _write(tracer, step: int, name: str, kind: str, group, tensor, where: str) -> None:
    flat = tensor.detach().reshape(-1)
    if flat.numel() == 0:
        return
    at = torch.tensor(spread_positions(flat.numel(), SAMPLE))
    values = flat[at].to(torch.float64).tolist()
    tracer.write(ev=Ev.TP_TENSOR, step=step, name=name, kind=kind, group=list(group),
                 values=values, numel=flat.numel(), where=where)

