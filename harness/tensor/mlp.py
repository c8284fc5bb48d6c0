"""The built-in MLP cut for tensor parallelism: fc1 by columns, fc2 by rows (the Megatron
pair: one all-reduce forward, one backward), the two heads replicated whole. Every rank
sees the same batch; the replicated parameters get the same gradient on every rank
without any synchronisation, because their inputs are the same after the all-reduce."""

from __future__ import annotations

import torch
from torch import nn

from distdoctor.tensor.layers import ColumnParallelLinear, RowParallelLinear, TrafficLog
from distdoctor.training.workload import MLP

SPLIT = {"fc1": "column", "fc2": "row"}  # the rest is replicated
REPLICATED = ("fc2.bias", "head.weight", "head.bias", "aux.weight", "aux.bias")


class TensorParallelMLP(nn.Module):
    """``reduce``: how fc2 ends (RowParallelLinear's "sum", "rows" or "none"). With "rows"
    (sequence parallelism) fc2's bias and the heads see only this rank's rows, so their
    gradients are this rank's share and must be summed over the group (``REPLICATED``)."""

    def __init__(self, full: MLP, rank: int, size: int, group=None, reduce: str = "sum"):
        super().__init__()
        self.log = TrafficLog()
        self.fc1 = ColumnParallelLinear(full.fc1, rank, size, self.log, group)
        self.fc2 = RowParallelLinear(full.fc2, rank, size, self.log, group, reduce)
        self.head, self.aux = full.head, full.aux
        self.rank, self.size = rank, size
        self.row_output: torch.Tensor | None = None  # fc2's output in the last forward

    def forward(self, x: torch.Tensor, use_aux: bool = True, masks=None):
        """``masks``: this rank's dropout keep-masks, fc1's slice and fc2's whole."""
        h = torch.tanh(self.fc1(x))
        if masks is not None:
            h = h * masks[0]
        out = self.fc2(h)
        self.row_output = out.detach()
        h = torch.tanh(out)
        if masks is not None:
            h = h * masks[1]
        return self.head(h), (self.aux(h) if use_aux else None)


def full_tensors(tp: TensorParallelMLP, per_rank: list[dict[str, torch.Tensor]]
                 ) -> dict[str, torch.Tensor]:
    """One model's tensors (parameters or gradients) put back together from every rank's
    slices: fc1's rows and bias concatenated, fc2's columns concatenated, the replicated
    ones taken from rank 0."""
    whole = {}
    for name in per_rank[0]:
        layer, _, kind = name.partition(".")
        parts = [r[name] for r in per_rank]
        if SPLIT.get(layer) == "column":
            whole[name] = torch.cat(parts, dim=0)
        elif SPLIT.get(layer) == "row" and kind == "weight":
            whole[name] = torch.cat(parts, dim=1)
        else:
            whole[name] = parts[0]
    return whole


def weight_bytes(hidden: int, inputs: int, size: int, element: int = 4) -> int:
    """Bytes of parameters one rank holds: fc1 and fc2's weights 1/size each, fc1's bias
    1/size, fc2's bias and both heads whole."""
    return element * (hidden * inputs // size + hidden // size + hidden * hidden // size
                      + hidden + 2 * (hidden + 1))


def allreduce_bytes(batch: int, hidden: int, inputs: int, input_grad: bool = True,
                    element: int = 4) -> dict[str, int]:
    """Per step and block, at more than one rank: forward, fc2's output (batch x hidden);
    backward, the gradient of fc1's input (batch x inputs), needed only when that input
    asks for a gradient (not for the data itself)."""
    return {"forward": batch * hidden * element,
            "backward": batch * inputs * element if input_grad else 0}
