"""Remedies for replicas that are not one state: parameters a rank's loss did not use,
replicas that started apart."""

from __future__ import annotations

import libcst as cst
from libcst import matchers as m

from distdoctor.fixing.syntax import (
    called_name,
    insert_after,
    module_alias,
    nodes,
    parsed,
    source_of,
    with_argument,
)


def find_unused(source: str, line: int, also: tuple[int, ...] = ()) -> str | None:
    """unused-params: the script's one DistributedDataParallel(...) (by that name or
    the usual alias DDP) told to look for parameters a rank's loss did not use:
    ``find_unused_parameters=True``. Several wrappers, or one told False already, are the
    user's to decide (``line``, where DDP stopped, is not where it was made)."""
    module = cst.parse_module(source)
    made = [c for c in nodes(module, cst.Call)
            if called_name(c.func) in ("DistributedDataParallel", "DDP")]
    if len(made) != 1 or any(a.keyword is not None and a.keyword.value ==
                             "find_unused_parameters" for a in made[0].args):
        return None
    bare = cst.SimpleWhitespace("")
    added = cst.Arg(cst.Name("True"), keyword=cst.Name("find_unused_parameters"),
                    equal=cst.AssignEqual(whitespace_before=bare, whitespace_after=bare))
    return source_of(module.deep_replace(made[0], with_argument(made[0], added)))


def broadcast_after_construction(source: str, line: int,
                                 also: tuple[int, ...] = ()) -> str | None:
    """divergent-parameters: the replicas started apart (each rank its own seed). Right
    after the model the script trains is made (the one name whose ``.parameters()`` it
    uses), every tensor of its state is broadcast from rank 0, as DDP does when it wraps
    one. Needs ``import torch.distributed as NAME``; several models are the user's."""
    tree, _, parents = parsed(source)
    owners = {c.func.value.value for c in nodes(tree, cst.Call)
              if isinstance(c.func, cst.Attribute) and c.func.attr.value == "parameters"
              and isinstance(c.func.value, cst.Name)}
    alias = module_alias(tree, "torch.distributed")
    if len(owners) != 1 or alias is None:
        return None
    model = owners.pop()
    made = next((s for s in nodes(tree, cst.SimpleStatementLine)
                 if len(s.body) == 1 and m.matches(s.body[0], m.Assign(
                     targets=[m.AssignTarget(target=m.Name(model))]))), None)
    if made is None:
        return None
    used = {n.value for n in nodes(tree, cst.Name)}
    each = next(n for n in ("tensor", "state", "_tensor") if n not in used)
    sync = cst.parse_statement(f"for {each} in {model}.state_dict().values():\n"
                               f"    {alias}.broadcast({each}, src=0)\n")
    return insert_after(tree, parents, made, sync)


def broadcast_the_buffers(source: str, line: int, also: tuple[int, ...] = ()) -> str | None:
    """divergent-buffers: the one DistributedDataParallel(...) told
    ``broadcast_buffers=False`` is told True (its default), so rank 0's buffers (running
    statistics) reach every replica at each forward. A wrapper that broadcasts already
    keeps its buffers apart some other way: not this edit."""
    module = cst.parse_module(source)
    told = [a for c in nodes(module, cst.Call)
            if called_name(c.func) in ("DistributedDataParallel", "DDP")
            for a in c.args if a.keyword is not None and a.keyword.value == "broadcast_buffers"
            and m.matches(a.value, m.Name("False"))]
    if len(told) != 1:
        return None
    return source_of(module.deep_replace(told[0].value, cst.Name("True")))
