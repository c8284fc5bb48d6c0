"""Remedies for a gradient that is not the mean: summed and never divided, an asynchronous
reduction never waited, micro-batches synchronised one by one."""

from __future__ import annotations

import libcst as cst
from libcst import matchers as m

from distdoctor.fixing.syntax import (
    called_name,
    enclosing,
    insert_after,
    module_alias,
    nodes,
    only_call,
    parsed,
    source_of,
    statements_at,
    with_import,
    wrapper_names,
)


def average_the_sum(source: str, line: int, also: tuple[int, ...] = ()) -> str | None:
    """sum-without-mean: after the all-reduce at ``line`` (a SUM by default), divide
    what it reduced by its group's size: ``X /= dist.get_world_size(group)``."""
    tree, positions, parents = parsed(source)
    for statement in statements_at(tree, positions, line):
        call = only_call(statement)
        if call is None or called_name(call.func) != "all_reduce" or not call.args:
            continue
        named = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        if "async_op" in named or "op" in named and not m.matches(
                named["op"], m.Attribute(attr=m.Name("SUM"))) or len(
                [a for a in call.args if a.keyword is None]) > 1:
            return None  # another reduction, or one waited on elsewhere: not ours to edit
        module = call.func.value if isinstance(call.func, cst.Attribute) else None
        reduced = call.args[0].value
        if module is None or not isinstance(reduced, (cst.Name, cst.Attribute, cst.Subscript)):
            return None  # all_reduce imported by name (no module to ask for the size), or
            # a temporary reduced (nothing to divide)
        size = cst.Call(cst.Attribute(module, cst.Name("get_world_size")),
                        [cst.Arg(named["group"])] if "group" in named else [])
        divide = statement.with_changes(body=[cst.AugAssign(
            reduced, cst.DivideAssign(), size)],
            leading_lines=[], trailing_whitespace=cst.TrailingWhitespace())
        return insert_after(tree, parents, statement, divide)
    return None


def wait_before_step(source: str, line: int, also: tuple[int, ...] = ()) -> str | None:
    """failed-sync, an asynchronous all-reduce never waited: its Work (``w = ...``) or the
    list its Works go to (``works.append(...)``) is waited on just before the optimizer
    step the report names among ``also``, so the reductions still overlap the rest."""
    tree, positions, parents = parsed(source)
    started = next(iter(statements_at(tree, positions, line)), None)
    held = _work_holder(started) if started is not None else None
    step = next((s for at in also for s in statements_at(tree, positions, at)
                 if (c := only_call(s)) is not None and called_name(c.func) == "step"),
                None)
    if held is None or step is None:
        return None
    name, many = held
    if many:
        used = {n.value for n in nodes(tree, cst.Name)}
        each = next(n for n in ("work", "pending", "handle", "_work") if n not in used)
        wait = cst.parse_statement(f"for {each} in {name}:\n    {each}.wait()\n")
    else:
        wait = cst.parse_statement(f"{name}.wait()\n")
    block = parents[step]
    if not isinstance(block, (cst.IndentedBlock, cst.Module)):
        return None
    body: list[cst.BaseStatement] = list(block.body)
    body.insert(body.index(step), wait.with_changes(leading_lines=step.leading_lines))
    body[body.index(step)] = step.with_changes(leading_lines=[])
    return source_of(tree.deep_replace(block, block.with_changes(body=body)))


def _work_holder(statement: cst.SimpleStatementLine) -> tuple[str, bool] | None:
    """Where an ``all_reduce(..., async_op=True)`` statement keeps its Work: (name, False)
    for ``w = all_reduce(...)``, (list, True) for ``works.append(all_reduce(...))``."""
    if len(statement.body) != 1:
        return None
    small = statement.body[0]
    async_call = m.Call(func=m.OneOf(m.Attribute(attr=m.Name("all_reduce")),
                                     m.Name("all_reduce")),
                        args=[m.ZeroOrMore(), m.Arg(keyword=m.Name("async_op"),
                                                     value=m.Name("True")), m.ZeroOrMore()])
    if m.matches(small, m.Assign(targets=[m.AssignTarget(target=m.Name())],
                                 value=async_call)):
        assert isinstance(small, cst.Assign) and isinstance(small.targets[0].target, cst.Name)
        return small.targets[0].target.value, False
    if m.matches(small, m.Expr(m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("append")),
                                      args=[m.Arg(value=async_call)]))):
        assert isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)
        func = small.value.func
        assert isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)
        return func.value.value, True
    return None


def sync_the_last(source: str, line: int, also: tuple[int, ...] = ()) -> str | None:
    """allreduce-every-microbatch: the micro-batch loop around ``line`` (``for i in
    range(n):``) runs its forward and backward (from ``line`` to the statement holding
    ``.backward()``) inside ``model.no_sync()`` for every micro-batch but the last, whose
    backward synchronises the accumulated gradients once."""
    tree, positions, parents = parsed(source)
    first = next(iter(statements_at(tree, positions, line)), None)
    if first is None:
        return None
    loop = enclosing(first, parents, cst.For)
    if loop is None or not isinstance(loop.body, cst.IndentedBlock) or \
            parents.get(first) is not loop.body or not isinstance(loop.target, cst.Name) or \
            not m.matches(loop.iter, m.Call(func=m.Name("range"), args=[m.Arg()])):
        return None
    wrappers = wrapper_names(tree)
    model = next((c.func.value for c in nodes(first, cst.Call)
                  if isinstance(c.func, cst.Name) and c.func.value in wrappers), None)
    body: list[cst.BaseStatement] = list(loop.body.body)
    start = body.index(first)
    end = next((i for i in range(start, len(body)) if any(
        isinstance(c.func, cst.Attribute) and c.func.attr.value == "backward"
        for c in nodes(body[i], cst.Call))), None)
    if model is None or end is None:
        return None
    code = cst.Module(body=[]).code_for_node
    assert isinstance(loop.iter, cst.Call)
    count = loop.iter.args[0].value
    last = str(int(count.value) - 1) if isinstance(count, cst.Integer) else \
        f"{code(count)} - 1"
    needs_import = module_alias(tree, "contextlib") is None
    wrapped = cst.parse_statement(
        f"with {model}.no_sync() if {loop.target.value} < {last} else "
        f"contextlib.nullcontext():\n    pass\n")
    assert isinstance(wrapped, cst.With) and isinstance(wrapped.body, cst.IndentedBlock)
    inner = [first.with_changes(leading_lines=[]), *body[start + 1:end + 1]]
    body[start:end + 1] = [wrapped.with_changes(
        body=wrapped.body.with_changes(body=inner), leading_lines=first.leading_lines)]
    edited = tree.deep_replace(loop.body, loop.body.with_changes(body=body))
    if not isinstance(edited, cst.Module):
        return None
    if needs_import:
        edited = with_import(edited, "import contextlib")
    return edited.code


def sync_the_last_instead(source: str, line: int, also: tuple[int, ...] = ()) -> str | None:
    """unsynced-microbatches: the micro-batch at ``line`` runs under ``with model.no_sync()
    if COND else ...:`` whose COND lets another micro-batch than the last synchronise (or
    none). COND becomes ``i < n - 1`` for the loop ``for i in range(n):`` around it, so
    only the last backward all-reduces, and the whole sum."""
    tree, positions, parents = parsed(source)
    first = next(iter(statements_at(tree, positions, line)), None)
    block = enclosing(first, parents, cst.With) if first is not None else None
    loop = enclosing(block, parents, cst.For) if block is not None else None
    if block is None or loop is None or len(block.items) != 1 or \
            not isinstance(loop.target, cst.Name) or \
            not m.matches(loop.iter, m.Call(func=m.Name("range"), args=[m.Arg(keyword=None)])):
        return None
    chosen = block.items[0].item
    if not m.matches(chosen, m.IfExp(body=m.Call(func=m.Attribute(attr=m.Name("no_sync"))))):
        return None  # (no_sync for every micro-batch, or another context: the user's)
    assert isinstance(chosen, cst.IfExp) and isinstance(loop.iter, cst.Call)
    count = loop.iter.args[0].value
    code = cst.Module(body=[]).code_for_node
    last = str(int(count.value) - 1) if isinstance(count, cst.Integer) else \
        f"{code(count)} - 1"
    test = cst.parse_expression(f"{loop.target.value} < {last}")
    if chosen.test.deep_equals(test):
        return None  # (already so: the cause is elsewhere)
    return source_of(tree.deep_replace(chosen.test, test))
