"""Part of a step skipped on some ranks of a DDP group: a forward with no backward.

Every rank of a DDP group runs each training forward's backward (its all-reduces are the
group's); a rank that skips one (a guard that ``continue``s on a bad loss its peers did
not see, an exception caught around the backward) shifts DDP's all-reduces by one against
its peers: gloo pairs them across steps, silently, and the job ends in a hang or a rank
that left early. Named from the forwards and backwards each rank recorded, with the
branch that skipped when the script's source shows it (a ``continue``, ``break`` or
``return`` between the forward's line and the backward's)."""

from __future__ import annotations

import ast
from pathlib import Path

from distdoctor.analysis.forwards import forwards_without_backward
from distdoctor.models import Finding, RunRecord
from distdoctor.models.calls import ranks_phrase, relative_line

NAME = "partial_step"


def check(record: RunRecord) -> list[Finding]:
    ddp = [r for r in record.ranks if len(r.evidence.ddp_group) > 1]
    skipped = {r.rank: forwards_without_backward(r.evidence) for r in ddp}
    if any(found is None for found in skipped.values()):
        return []  # a rank's backwards are not known: nothing to compare
    at = {rank: {f.steps_before for f in found or ()} for rank, found in skipped.items()}
    common: set[int] = set.intersection(*at.values()) if at else set()
    culprits = sorted(r for r in at if at[r] - common)
    if not culprits:
        return []  # no rank skipped, or every rank skipped alike
    rank = culprits[0]
    forward = next(f for f in skipped[rank] or () if f.steps_before not in common)
    backward = next((p.where for r in ddp for p in r.evidence.phases
                     if p.kind == "backward" and p.where), "")
    branch = _branch(forward.where, backward)
    others = ranks_phrase([r for r in at if r not in culprits])
    step = forward.steps_before + 1
    said = (f"; it left the step at {relative_line(branch[0])} ({branch[1]})" if branch
            else "")
    lines = tuple(dict.fromkeys(line for line in (branch[0] if branch else "", forward.where,
                                                  backward) if line))
    return [Finding(
        check=NAME, fault="partial-step", kind="partial-step",
        symptom=f"{ranks_phrase(culprits)} ran the DDP forward of step {step} at "
                f"{relative_line(forward.where)} and then no backward before its next "
                f"forward, where {others} ran the backward"
                f"{f' at {relative_line(backward)}' if backward else ''}{said}: DDP's "
                f"gradient all-reduces then pair one rank's step with another's",
        cause="part of a step is skipped on some ranks only (a guard on a value only they "
              "saw, such as a non-finite loss), so the ranks' DDP all-reduces no longer "
              "correspond",
        fix="decide a skip on every rank alike: all-reduce the condition first (skip = "
            "torch.tensor([float(not math.isfinite(loss.item()))]); dist.all_reduce(skip, "
            "op=dist.ReduceOp.MAX)) and skip on every rank when it is set, or keep the "
            "step on every rank with a finite loss (torch.nan_to_num, or the bad samples' "
            "loss zeroed)" + (f" at {relative_line(branch[0])}" if branch else ""),
        fix_changes={}, ranks=tuple(culprits),
        measured={"step": step, "skipped": {str(r): sorted(s + 1 for s in at[r]) for r in at},
                  "branch": relative_line(branch[0]) if branch else None},
        headline=f"step {step}'s backward skipped", first_step=step, where=lines)]


def _branch(forward: str, backward: str) -> tuple[str, str] | None:
    """The ``continue``/``break``/``return`` in the loop around ``forward``'s line, after it
    and before ``backward``'s line (same file), with the condition it sits under; None
    when the source cannot be read or shows none."""
    path, _, line = forward.rpartition(":")
    if not path or not line.isdigit():
        return None
    end = int(backward.rpartition(":")[2]) if backward.startswith(path + ":") and \
        backward.rpartition(":")[2].isdigit() else None
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    start = int(line)
    loops = [n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.While))
             and n.lineno <= start <= (n.end_lineno or n.lineno)]
    if not loops:
        return None
    loop = max(loops, key=lambda n: n.lineno)  # the innermost
    for node in ast.walk(loop):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Continue, ast.Break, ast.Return)) and \
                    child.lineno > start and (end is None or child.lineno < end) and \
                    isinstance(node, ast.If):
                word = type(child).__name__.lower()
                return (f"{path}:{child.lineno}",
                        f"{word} under 'if {ast.unparse(node.test)}' at line {node.lineno}")
    return None
