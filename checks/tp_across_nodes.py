"""Does tensor parallelism stay inside a node?

A tensor-parallel group all-reduces in every row-parallel layer's forward and backward,
per micro-batch, with the next layer waiting on it; the data-parallel average comes once
per step and can overlap the backward. So the tensor-parallel groups belong on the fast
links inside a node and the data-parallel ones across nodes. A tensor-parallel group
spread over nodes, when its size fits in one, is the mesh's dimensions swapped; the bytes
each layout would send between nodes per step are worked out from the bytes measured.
"""

from __future__ import annotations

from collections import Counter

from distdoctor.checks import finding
from distdoctor.models import Finding, RunRecord

NAME = "tp_across_nodes"


def check(record: RunRecord) -> list[Finding]:
    if not any(r.evidence.traffic for r in record.ranks):
        return _user_mesh(record)
    node = {r.rank: r.evidence.node for r in record.ranks}
    if len(set(node.values())) < 2:
        return []
    per_node = max(Counter(node.values()).values())
    traffic = [(r.rank, t) for r in record.ranks for t in r.evidence.traffic]
    tensor_groups = sorted({t.group for _, t in traffic if t.purpose == "tensor"
                            and len(t.group) > 1})
    spanning = [g for g in tensor_groups if len({node[r] for r in g}) > 1]
    if not spanning or any(len(g) > per_node or per_node % len(g) for g in spanning):
        return []  # inside nodes already, or too big for one: no swap keeps it inside
    steps = sorted({t.step for _, t in traffic})
    now = swapped = calls = 0
    for _, t in traffic:
        across = len({node[r] for r in t.group}) > 1
        if t.purpose == "tensor":
            now += t.bytes if across else 0
            calls += t.calls if across else 0
        else:
            # swapped, the replicas' groups take one rank from each node
            now += t.bytes if across else 0
            swapped += t.bytes if len(t.group) > 1 else 0
    per_step = len(steps) or 1
    now, swapped, calls = now // per_step, swapped // per_step, calls // per_step
    measured = {"tensor_groups": [list(g) for g in spanning], "ranks_per_node": per_node,
                "nodes": {str(r): n for r, n in sorted(node.items())},
                "bytes_across_nodes_per_step": now,
                "bytes_across_nodes_per_step_if_swapped": swapped,
                "tensor_allreduces_across_nodes_per_step": calls}
    return [finding(
        "tp-across-nodes", check=NAME,
        headline=f"tensor-parallel groups span nodes: {now} B a step "
        f"cross, {swapped} B if swapped",
        symptom=f"tensor-parallel group{'s' if len(spanning) > 1 else ''} "
        f"{', '.join(str(g) for g in spanning)} span{'' if len(spanning) > 1 else 's'} "
        f"nodes of {per_node} ranks: per step, {calls} tensor-parallel collectives in the "
        f"layers' forward and backward and {now} bytes in all cross between nodes; with "
        f"the mesh's dimensions swapped, {swapped} bytes would, all of it the once-a-step "
        f"gradient average", fix_changes={"knobs.tp_inside_node": True},
        ranks=sorted({r for g in spanning for r in g}), measured=measured,
        kind="tp-across-nodes")]


def _user_mesh(record: RunRecord) -> list[Finding]:
    """A user's script: each rank's node is the one its launcher numbered (torchrun's
    GROUP_RANK), and its tensor-parallel groups those of the layers parallelize_module cut
    (the tracer's group tensors). A group spread over nodes, when its size fits in one, is
    the mesh's dimensions swapped. The bytes are not worked out: DTensor's collectives are
    not traced."""
    node: dict[int, str] = {}
    for rank in record.ranks:
        startup = rank.evidence.startup
        said = startup.variable("GROUP_RANK") if startup is not None else None
        if said is None:
            return []  # a launcher that numbers no nodes: one machine, as far as is known
        node[rank.rank] = said
    if len(set(node.values())) < 2:
        return []
    per_node = max(Counter(node.values()).values())
    first: dict[tuple[int, ...], str] = {}  # group -> the first line a layer of it showed at
    for rank in record.ranks:
        for tensor in rank.evidence.group_tensors:
            if len(tensor.group) > 1 and set(tensor.group) <= set(node):
                first.setdefault(tuple(tensor.group), tensor.where)
    spanning = sorted(g for g in first if len({node[r] for r in g}) > 1)
    if not spanning or any(len(g) > per_node or per_node % len(g) for g in spanning):
        return []
    ranks = sorted({r for g in spanning for r in g})
    where = first[spanning[0]]
    groups = ", ".join(str(list(g)) for g in spanning)
    return [finding(
        "tp-across-nodes", check=NAME, kind="tp-across-nodes", where=where,
        headline=f"tensor-parallel groups span nodes of {per_node} ranks",
        symptom=f"tensor-parallel group{'s' if len(spanning) > 1 else ''} {groups} "
        f"span{'' if len(spanning) > 1 else 's'} nodes of {per_node} ranks (the launcher's "
        f"node of each rank: {', '.join(f'{r}: {n}' for r, n in sorted(node.items()))}): "
        f"every all-reduce of their layers' forward and backward crosses between nodes, "
        f"while groups of {len(spanning[0])} fit in one",
        fix_changes={"knobs.tp_inside_node": True}, ranks=ranks,
        measured={"tensor_groups": [list(g) for g in spanning], "ranks_per_node": per_node,
                  "nodes": {str(r): n for r, n in sorted(node.items())}})]
