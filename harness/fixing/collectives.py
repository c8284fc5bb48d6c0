"""Remedies for ranks that do not make the same calls: a send cycle, a forward through
the DDP wrapper on some ranks only."""

from __future__ import annotations

import libcst as cst

from distdoctor.fixing.syntax import (
    called_name,
    enclosing,
    module_alias,
    nodes,
    only_call,
    parsed,
    source_of,
    statements_at,
    wrapper_names,
)


def alternate_the_pair(source: str, line: int, also: tuple[int, ...] = ()) -> str | None:
    """p2p-cycle, every rank sending before it receives: the send at ``line`` and the
    receive right after it (or the other way round) are made in that order on even ranks
    and in the other on odd ones, so each send meets a receive. Needs ``import
    torch.distributed as NAME`` (the rank is asked of it)."""
    tree, positions, parents = parsed(source)
    alias = module_alias(tree, "torch.distributed")
    first = next(iter(statements_at(tree, positions, line)), None)
    block = parents.get(first) if first is not None else None
    if alias is None or first is None or not isinstance(block, (cst.IndentedBlock,
                                                                  cst.Module)):
        return None
    body: list[cst.BaseStatement] = list(block.body)
    at = body.index(first)
    second = body[at + 1] if at + 1 < len(body) else None
    kinds = [_blocking_p2p(s) for s in (first, second)]
    if second is None or set(kinds) != {"send", "recv"}:
        return None  # not a blocking send and receive side by side
    assert isinstance(second, cst.SimpleStatementLine)
    code = cst.Module(body=[]).code_for_node
    kept = [code(s.with_changes(leading_lines=[])).strip() for s in (first, second)]
    bare = [code(s.with_changes(leading_lines=[], trailing_whitespace=cst.TrailingWhitespace()))
            .strip() for s in (first, second)]  # (the comments stay with the first copy)
    paired = cst.parse_statement(
        f"if {alias}.get_rank() % 2 == 0:\n    {kept[0]}\n    {kept[1]}\nelse:\n"
        f"    {bare[1]}\n    {bare[0]}\n")
    body[at:at + 2] = [paired.with_changes(leading_lines=first.leading_lines)]
    return source_of(tree.deep_replace(block, block.with_changes(body=body)))


def _blocking_p2p(statement: cst.CSTNode | None) -> str | None:
    """"send" or "recv" for a statement that is one blocking point-to-point call."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return None
    call = only_call(statement)
    name = called_name(call.func) if call is not None else None
    return name if name in ("send", "recv") else None


def evaluate_the_module(source: str, line: int, also: tuple[int, ...] = ()) -> str | None:
    """collective-mismatch from a forward through the DDP wrapper on some ranks only (an
    evaluation under a rank guard): DDP's forward makes collectives the other ranks never
    make there. The statement at ``line`` calls the wrapped module instead
    (``model.module(...)``), under ``torch.no_grad()``: no collective, no graph."""
    tree, positions, parents = parsed(source)
    wrappers = wrapper_names(tree)
    torch = module_alias(tree, "torch")
    statement = next(iter(statements_at(tree, positions, line)), None)
    if statement is None or torch is None or enclosing(statement, parents, cst.If) is None:
        return None  # (a forward on every rank is not this cause)
    calls = [c for c in nodes(statement, cst.Call)
             if isinstance(c.func, cst.Name) and c.func.value in wrappers]
    if len(calls) != 1:
        return None
    inner = statement.deep_replace(calls[0], calls[0].with_changes(
        func=cst.Attribute(calls[0].func, cst.Name("module"))))
    if not isinstance(inner, cst.SimpleStatementLine):
        return None
    guarded = cst.parse_statement(f"with {torch}.no_grad():\n    pass\n")
    assert isinstance(guarded, cst.With) and isinstance(guarded.body, cst.IndentedBlock)
    guarded = guarded.with_changes(
        body=guarded.body.with_changes(body=[inner.with_changes(leading_lines=[])]),
        leading_lines=statement.leading_lines)
    block = parents[statement]
    if not isinstance(block, (cst.IndentedBlock, cst.Module)):
        return None
    body: list[cst.BaseStatement] = list(block.body)
    body[body.index(statement)] = guarded
    return source_of(tree.deep_replace(block, block.with_changes(body=body)))
