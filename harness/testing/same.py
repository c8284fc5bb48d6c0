"""``assert_same_on_all_ranks``: replicas that should be one model, checked entry by entry.

Called on every rank of the group (it is a collective). Each rank flattens what it was
given into named entries (a module's parameters and buffers, a state dict's or an
optimiser state's leaves), every rank gathers every rank's entries, and every rank reaches
the same verdict, so all raise together and none is left waiting. The message names the
entries that differ, the ranks that disagree with the lowest rank, and by how much.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

SHOWN = 8  # differing entries named in a message


@dataclass(frozen=True)
class Difference:
    entry: str
    ranks: tuple[int, ...]  # the ranks that disagree with the lowest rank of the group
    against: int  # that lowest rank
    detail: str  # by how much, or what differs


def assert_same_on_all_ranks(value: Any, *, atol: float = 0.0, rtol: float = 0.0,
                             group=None) -> None:
    """Raise AssertionError on every rank unless ``value`` (a tensor, a module, a state
    dict, an optimiser, or nested dicts and lists of those and plain values) is the same
    on every rank of ``group``, within ``atol + rtol * |x|`` for floating tensors."""
    __tracebackhide__ = True
    import torch.distributed as dist

    mine = flatten(value)
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, mine, group=group)
    ranks = dist.get_process_group_ranks(group) if group is not None else \
        list(range(len(gathered)))
    found = differences(dict(zip(ranks, gathered)), atol, rtol)
    if found:
        what, entries = type(value).__name__, len(set().union(*gathered))
        parted = len({d.entry for d in found})
        count = f" ({parted} of {entries} entries)" if entries > 1 else ""
        lines = [f"the {what} differs across ranks {', '.join(map(str, ranks))}{count}:"]
        lines += [f"  {d.entry}: rank{'s' if len(d.ranks) > 1 else ''} "
                  f"{', '.join(map(str, d.ranks))} vs rank {d.against}: {d.detail}"
                  for d in found[:SHOWN]]
        if len(found) > SHOWN:
            lines.append(f"  ... and {len(found) - SHOWN} more")
        raise AssertionError("\n".join(lines))


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Named leaves: tensors detached on the CPU, everything else as it is."""
    if isinstance(value, torch.Tensor):
        return {prefix or "tensor": value.detach().cpu()}
    if isinstance(value, torch.nn.Module):
        found = {f"{prefix}param {n}": p.detach().cpu() for n, p in value.named_parameters()}
        found |= {f"{prefix}buffer {n}": b.detach().cpu() for n, b in value.named_buffers()}
        return found
    if isinstance(value, torch.optim.Optimizer):
        return flatten(value.state_dict(), prefix)
    if isinstance(value, dict):
        found = {}
        for key, item in value.items():
            found |= flatten(item, f"{prefix}{key}" if not prefix else f"{prefix}.{key}")
        return found
    if isinstance(value, (list, tuple)):
        found = {}
        for index, item in enumerate(value):
            found |= flatten(item, f"{prefix}[{index}]")
        return found
    return {prefix or "value": value}


def differences(by_rank: dict[int, dict[str, Any]], atol: float,
                rtol: float) -> list[Difference]:
    """Each entry on which some rank disagrees with the lowest rank."""
    first = min(by_rank)
    reference = by_rank[first]
    names = sorted(set().union(*by_rank.values()), key=_entry_order(reference))
    found = []
    for name in names:
        details: dict[str, list[int]] = {}
        for rank, entries in sorted(by_rank.items()):
            if rank == first:
                continue
            detail = compare_entry(reference, entries, name, atol, rtol)
            if detail:
                details.setdefault(detail, []).append(rank)
        for detail, ranks in details.items():
            found.append(Difference(name, tuple(ranks), first, detail))
    return found


def _entry_order(reference: dict[str, Any]):
    order = {name: i for i, name in enumerate(reference)}
    return lambda name: (order.get(name, len(order)), name)


def compare_entry(reference: dict[str, Any], other: dict[str, Any], name: str, atol: float,
                  rtol: float) -> str | None:
    if name not in other:
        return "missing"
    if name not in reference:
        return "present only there"
    a, b = reference[name], other[name]
    if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
        return f"{type(b).__name__} vs {type(a).__name__}"
    if not isinstance(a, torch.Tensor):
        return None if a == b else f"{b!r} vs {a!r}"
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"shape {tuple(b.shape)} {b.dtype} vs {tuple(a.shape)} {a.dtype}"
    if not (a.is_floating_point() or a.is_complex()):
        unequal = (a != b).nonzero()
        return None if unequal.numel() == 0 else \
            f"{len(unequal)} of {a.numel()} elements differ, first at {_index(unequal[0])}"
    gap = (b.double() - a.double()).abs()
    limit = atol + rtol * a.double().abs()
    over = (gap > limit) | (torch.isnan(a) != torch.isnan(b))
    if not bool(over.any()):
        return None
    worst = torch.where(over, torch.nan_to_num(gap, nan=float("inf")),
                        torch.zeros_like(gap)).argmax()
    at = tuple(int(i) for i in torch.unravel_index(worst, a.shape)) if a.dim() else ()
    return (f"max abs difference {float(gap.flatten()[worst]):.3g} at {_index(at)} "
            f"({float(b.flatten()[worst]):.6g} vs {float(a.flatten()[worst]):.6g}), "
            f"{int(over.sum())} of {a.numel()} elements over the tolerance")


def _index(at) -> str:
    values = [int(i) for i in at]
    return "(" + ", ".join(map(str, values)) + ("," if len(values) == 1 else "") + ")"
