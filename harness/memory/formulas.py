"""Bytes per rank of each training state, by ZeRO stage, precision and world size.

The literature quotes both 16 and 12 bytes per parameter for mixed-precision Adam; they
differ in one state, the fp32 master copy of the weights, so the precision names it:

- ``fp32``: fp32 parameters (4) and gradients (4), Adam's m and v (8): 16 bytes.
- ``mixed``: bf16 parameters (2) and gradients (2), fp32 m and v (8), no master copy:
  12 bytes (what "7B: 112 GB in fp32, 84 GB in mixed precision" and "70B under FSDP on 8
  GPUs: 105 GB" count).
- ``mixed-master``: as mixed, plus an fp32 master copy (4): 16 bytes (the ZeRO paper's
  accounting, behind "vanilla mixed precision: 16P" and "ZeRO-1: 4P + 12P/N").

Stage 1 shards the optimiser state (master copy included), stage 2 the gradients too,
stage 3 the parameters too, which then adds the working set of the largest layer while it
is gathered: its parameters and its gradient, unsharded.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9  # decimal gigabytes, as accelerator memory is sold


@dataclass(frozen=True)
class Precision:
    name: str
    param: int  # bytes per parameter, as the model computes with it
    grad: int
    master: int  # fp32 master copy of the weights (0: none)
    moments: int  # Adam's m and v
    summary: str

    @property
    def per_param(self) -> int:
        return self.param + self.grad + self.master + self.moments


PRECISIONS = {p.name: p for p in (
    Precision("fp32", 4, 4, 0, 8, "fp32 parameters and gradients, fp32 Adam m and v"),
    Precision("mixed", 2, 2, 0, 8, "bf16 parameters and gradients, fp32 Adam m and v, "
              "no fp32 master copy"),
    Precision("mixed-master", 2, 2, 4, 8, "bf16 parameters and gradients, fp32 master "
              "copy, fp32 Adam m and v"),
)}


@dataclass(frozen=True)
class StageBytes:
    """One rank's bytes of each state at one ZeRO stage."""

    stage: int
    params: float
    grads: float
    optimizer: float  # master copy and Adam's moments
    gathered: float  # ZeRO-3: the largest layer's parameters and gradient, unsharded
    activations: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.gathered + self.activations


def stage_bytes(stage: int, params: float, world_size: int, precision: Precision,
                largest_layer: float = 0.0, activations: float = 0.0) -> StageBytes:
    """Bytes per rank for ``params`` parameters on ``world_size`` ranks at ``stage``."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage}")
    n = world_size

    def share(bytes_per_param: int, sharded: bool) -> float:
        return bytes_per_param * params / (n if sharded else 1)

    return StageBytes(
        stage=stage,
        params=share(precision.param, stage >= 3),
        grads=share(precision.grad, stage >= 2),
        optimizer=share(precision.master + precision.moments, stage >= 1),
        gathered=(precision.param + precision.grad) * largest_layer if stage == 3 else 0.0,
        activations=activations)


def deepspeed_estimate(stage: int, params: float, world_size: int,
                       largest_layer: float = 0.0) -> float | None:
    """DeepSpeed's own estimators (fp16 mixed precision, no offload), for comparison:
    ZeRO-2 2P + 18P/N, ZeRO-3 4L + 18P/N; None for the stages it has no estimator for."""
    if stage == 2:
        return 2 * params + 18 * params / world_size
    if stage == 3:
        return 4 * largest_layer + 18 * params / world_size
    return None
