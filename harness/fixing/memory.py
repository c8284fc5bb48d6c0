"""The remedy for a rank over its memory budget: the optimiser's state partitioned across
the ranks (ZeRO-1), the smallest change of a script that trains with every state whole.

Adam keeps two moments per parameter: half the state of a DDP rank that trains with it.
``torch.distributed.optim.ZeroRedundancyOptimizer`` wraps the same optimiser class with
the same settings and keeps on each rank only its partition's state; the update, and so
the training, is the same. Where the check planned more (the parameters sharded too,
more ranks), this edit does not fit the budget and its verifying run says so: no patch
is offered, and the report's fix stands.
"""

from __future__ import annotations

import libcst as cst

from distdoctor.fixing.syntax import dotted, module_alias, nodes, source_of, with_import

ZERO = "ZeroRedundancyOptimizer"
# a script that calls these partitions or shards its state already: ZeRO-1 is no step up
SHARDED_ALREADY = {ZERO, "fully_shard", "FullyShardedDataParallel", "FSDP"}


def partition_the_optimizer_state(source: str, line: int,
                                  also: tuple[int, ...] = ()) -> str | None:
    """over-memory-budget: the script's one optimiser made from torch.optim (by a dotted
    name or one imported from it) wrapped as ``ZeroRedundancyOptimizer(params,
    optimizer_class=THE_CLASS, **its settings)``. None where there is not exactly one,
    where a setting is passed by position (ZeRO takes them by keyword), or where the
    script partitions or shards its state already (FSDP's parameters are not ZeRO's)."""
    module = cst.parse_module(source)
    imported = {a.evaluated_alias or dotted(a.name) for i in nodes(module, cst.ImportFrom)
                if i.module is not None and dotted(i.module) == "torch.optim"
                and not isinstance(i.names, cst.ImportStar) for a in i.names}
    optim = module_alias(module, "torch.optim") or next(
        (a.evaluated_alias or "optim" for i in nodes(module, cst.ImportFrom)
         if i.module is not None and dotted(i.module) == "torch"
         and not isinstance(i.names, cst.ImportStar) for a in i.names
         if dotted(a.name) == "optim"), None)
    torch = module_alias(module, "torch")

    def is_optimizer(call: cst.Call) -> bool:
        name = dotted(call.func)
        head, _, last = name.rpartition(".")
        return last[:1].isupper() and (
            name in imported or (torch is not None and head == f"{torch}.optim")
            or (optim is not None and head == optim))

    made = [c for c in nodes(module, cst.Call) if is_optimizer(c)]
    called = {dotted(c.func).rpartition(".")[2] for c in nodes(module, cst.Call)}
    if len(made) != 1 or called & SHARDED_ALREADY:
        return None
    call = made[0]
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if len(positional) != 1 or any(a.star for a in call.args):
        return None
    bare = cst.SimpleWhitespace("")
    equal = cst.AssignEqual(whitespace_before=bare, whitespace_after=bare)
    space = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    wrapped = call.with_changes(
        func=cst.Name(ZERO),
        args=[positional[0].with_changes(comma=space),
              cst.Arg(call.func, keyword=cst.Name("optimizer_class"), equal=equal,
                      comma=space if len(call.args) > 1 else cst.MaybeSentinel.DEFAULT),
              *(a for a in call.args if a is not positional[0])])
    edited = module.deep_replace(call, wrapped)
    return source_of(with_import(edited, f"from torch.distributed.optim import {ZERO}",
                                 last=True))
