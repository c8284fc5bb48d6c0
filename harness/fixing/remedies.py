"""The edits that cure a finding in a user's own script, made on its concrete syntax tree.

Each remedy takes the script's source, the finding's line (the line the report names) and
its other lines in the same file (``also``: where a step is, say), and returns the edited
source, or None where no edit is safe (the code is not the shape
the remedy knows: then the report's prose fix stands alone). Edits go through libcst,
which keeps every byte it is not told to change (formatting, comments), so the patch is
the lines that change and nothing else. A remedy proposes; it never decides that it
worked: verify.py re-runs the patched copy on real ranks.
"""

from __future__ import annotations

from typing import Callable

import libcst as cst
from libcst import matchers as m
from libcst.metadata import ParentNodeProvider, PositionProvider

Remedy = Callable[[str, int, tuple[int, ...]], "str | None"]


def average_the_sum(source: str, line: int, also: tuple[int, ...] = ()) -> str | None:
    """gradient-not-averaged: after the all-reduce at ``line`` (a SUM by default), divide
    what it reduced by its group's size: ``X /= dist.get_world_size(group)``."""
    tree, positions, parents = _parsed(source)
    for statement in _statements_at(tree, positions, line):
        call = _only_call(statement)
        if call is None or _called_name(call.func) != "all_reduce" or not call.args:
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
        return _insert_after(tree, parents, statement, divide)
    return None


def set_the_epoch(source: str, line: int, also: tuple[int, ...] = ()) -> str | None:
    """repeated-epoch-order: the loader iterated at ``line`` draws from a
    DistributedSampler; at the head of the loop around it (the epoch loop), tell the
    sampler the epoch: ``sampler.set_epoch(epoch)``."""
    tree, positions, parents = _parsed(source)
    found = _loop_over_a_name(tree, positions, line)
    if found is None:
        return None
    loop, loader = found
    sampler = _sampler_of(tree, loader)
    outer = _enclosing(loop, parents, cst.For)
    if sampler is None or outer is None or not isinstance(outer.target, cst.Name) or \
            not isinstance(outer.body, cst.IndentedBlock):
        return None
    call = cst.parse_statement(f"{sampler}.set_epoch({outer.target.value})\n")
    head = outer.body.body[0] if outer.body.body else None
    if head is not None and m.matches(head, m.SimpleStatementLine(body=[m.Expr(m.Call(
            func=m.Attribute(value=m.Name(sampler), attr=m.Name("set_epoch"))))])):
        return None  # told already (with a constant, maybe): not a mechanical edit
    edited = outer.with_changes(body=outer.body.with_changes(body=[call, *outer.body.body]))
    return _code(tree.deep_replace(outer, edited))


def find_unused(source: str, line: int, also: tuple[int, ...] = ()) -> str | None:
    """unused-parameters: the script's one DistributedDataParallel(...) (by that name or
    the usual alias DDP) told to look for parameters a rank's loss did not use:
    ``find_unused_parameters=True``. Several wrappers, or one told False already, are the
    user's to decide (``line``, where DDP stopped, is not where it was made)."""
    module = cst.parse_module(source)
    made = [c for c in _nodes(module, cst.Call)
            if _called_name(c.func) in ("DistributedDataParallel", "DDP")]
    if len(made) != 1 or any(a.keyword is not None and a.keyword.value ==
                             "find_unused_parameters" for a in made[0].args):
        return None
    bare = cst.SimpleWhitespace("")
    added = cst.Arg(cst.Name("True"), keyword=cst.Name("find_unused_parameters"),
                    equal=cst.AssignEqual(whitespace_before=bare, whitespace_after=bare))
    return _code(module.deep_replace(made[0], _with_argument(made[0], added)))


def _with_argument(call: cst.Call, added: cst.Arg) -> cst.Call:
    """``call`` with one more argument, laid out as its others: after ", " on one line, or
    on a line of its own, with the trailing comma, where the arguments are one per line
    (a comment after the last one stays with it)."""
    args = list(call.args)
    comma = args[-1].comma if args else None
    if not isinstance(comma, cst.Comma) or \
            not isinstance(comma.whitespace_after, cst.ParenthesizedWhitespace):
        return call.with_changes(args=[*args, added])
    last, closing = args[-1], comma.whitespace_after
    before = args[-2].comma.whitespace_after if len(args) > 1 and \
        isinstance(args[-2].comma, cst.Comma) else call.whitespace_before_args
    indent = before.last_line if isinstance(before, cst.ParenthesizedWhitespace) else \
        closing.last_line
    return call.with_changes(args=[
        *args[:-1],
        last.with_changes(comma=comma.with_changes(  # its comment kept, then the
            whitespace_after=closing.with_changes(last_line=indent))),  # arguments' indent
        added.with_changes(comma=cst.Comma(whitespace_after=closing.with_changes(
            first_line=cst.TrailingWhitespace(), empty_lines=[])))])


def wait_before_step(source: str, line: int, also: tuple[int, ...] = ()) -> str | None:
    """failed-sync, an asynchronous all-reduce never waited: its Work (``w = ...``) or the
    list its Works go to (``works.append(...)``) is waited on just before the optimizer
    step the report names among ``also``, so the reductions still overlap the rest."""
    tree, positions, parents = _parsed(source)
    started = next(iter(_statements_at(tree, positions, line)), None)
    held = _work_holder(started) if started is not None else None
    step = next((s for at in also for s in _statements_at(tree, positions, at)
                 if (c := _only_call(s)) is not None and _called_name(c.func) == "step"),
                None)
    if held is None or step is None:
        return None
    name, many = held
    if many:
        used = {n.value for n in _nodes(tree, cst.Name)}
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
    return _code(tree.deep_replace(block, block.with_changes(body=body)))


def broadcast_after_construction(source: str, line: int,
                                 also: tuple[int, ...] = ()) -> str | None:
    """divergent-parameters: the replicas started apart (each rank its own seed). Right
    after the model the script trains is made (the one name whose ``.parameters()`` it
    uses), every tensor of its state is broadcast from rank 0, as DDP does when it wraps
    one. Needs ``import torch.distributed as NAME``; several models are the user's."""
    tree, _, parents = _parsed(source)
    owners = {c.func.value.value for c in _nodes(tree, cst.Call)
              if isinstance(c.func, cst.Attribute) and c.func.attr.value == "parameters"
              and isinstance(c.func.value, cst.Name)}
    alias = _module_alias(tree, "torch.distributed")
    if len(owners) != 1 or alias is None:
        return None
    model = owners.pop()
    made = next((s for s in _nodes(tree, cst.SimpleStatementLine)
                 if len(s.body) == 1 and m.matches(s.body[0], m.Assign(
                     targets=[m.AssignTarget(target=m.Name(model))]))), None)
    if made is None:
        return None
    used = {n.value for n in _nodes(tree, cst.Name)}
    each = next(n for n in ("tensor", "state", "_tensor") if n not in used)
    sync = cst.parse_statement(f"for {each} in {model}.state_dict().values():\n"
                               f"    {alias}.broadcast({each}, src=0)\n")
    return _insert_after(tree, parents, made, sync)


def _module_alias(module: cst.Module, dotted: str) -> str | None:
    """The name ``import DOTTED as NAME`` binds (or DOTTED itself, imported plainly)."""
    for imported in _nodes(module, cst.Import):
        for alias in imported.names:
            if _dotted(alias.name) == dotted:
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    return alias.asname.name.value
                return dotted
    return None


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return ""


def alternate_the_pair(source: str, line: int, also: tuple[int, ...] = ()) -> str | None:
    """p2p-cycle, every rank sending before it receives: the send at ``line`` and the
    receive right after it (or the other way round) are made in that order on even ranks
    and in the other on odd ones, so each send meets a receive. Needs ``import
    torch.distributed as NAME`` (the rank is asked of it)."""
    tree, positions, parents = _parsed(source)
    alias = _module_alias(tree, "torch.distributed")
    first = next(iter(_statements_at(tree, positions, line)), None)
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
    return _code(tree.deep_replace(block, block.with_changes(body=body)))


def _blocking_p2p(statement: cst.CSTNode | None) -> str | None:
    """"send" or "recv" for a statement that is one blocking point-to-point call."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return None
    call = _only_call(statement)
    name = _called_name(call.func) if call is not None else None
    return name if name in ("send", "recv") else None


def shard_the_loader(source: str, line: int, also: tuple[int, ...] = ()) -> str | None:
    """duplicate-samples: the loader iterated at ``line`` reads the whole dataset on every
    rank. It is given a DistributedSampler of its dataset (its ``shuffle`` moved onto the
    sampler), made just before it, and the sampler is told the epoch at the head of the
    loop around (set_the_epoch), as every sharded loader must be."""
    tree, positions, parents = _parsed(source)
    found = _loop_over_a_name(tree, positions, line)
    if found is None:
        return None
    loop, loader = found
    made = next((s for s in _nodes(tree, cst.SimpleStatementLine)
                 if len(s.body) == 1 and isinstance(s.body[0], cst.Assign)
                 and m.matches(s.body[0], m.Assign(targets=[m.AssignTarget(
                     target=m.Name(loader))], value=m.Call()))), None)
    call = made.body[0].value if made is not None and \
        isinstance(made.body[0], cst.Assign) else None
    if made is None or not isinstance(call, cst.Call) or \
            _called_name(call.func) != "DataLoader" or not call.args or \
            call.args[0].keyword is not None or any(
                a.keyword is not None and a.keyword.value in ("sampler", "batch_sampler")
                for a in call.args):
        return None
    named = _importable(tree, "torch.utils.data", "DistributedSampler")
    if named is None:
        return None
    used = {n.value for n in _nodes(tree, cst.Name)}
    sampler = next(n for n in ("sampler", "train_sampler", "shard_sampler") if n not in used)
    shuffle = next((a.value for a in call.args if a.keyword is not None
                    and a.keyword.value == "shuffle"), None)
    code = cst.Module(body=[]).code_for_node
    made_sampler = cst.parse_statement(
        f"{sampler} = {named[0]}({code(call.args[0].value)}"
        f"{', shuffle=' + code(shuffle) if shuffle is not None else ''})\n")
    args = [a for a in call.args if a.keyword is None or a.keyword.value != "shuffle"]
    told = made.with_changes(body=[made.body[0].with_changes(value=_with_argument(
        call.with_changes(args=[*args[:-1], args[-1].with_changes(
            comma=call.args[-1].comma)]),
        cst.Arg(cst.Name(sampler), keyword=cst.Name("sampler"), equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""),
            whitespace_after=cst.SimpleWhitespace("")))))])
    block = parents[made]
    if not isinstance(block, (cst.IndentedBlock, cst.Module)):
        return None
    body: list[cst.BaseStatement] = list(block.body)
    at = body.index(made)
    body[at:at + 1] = [made_sampler.with_changes(leading_lines=made.leading_lines),
                       told.with_changes(leading_lines=[])]
    edited = tree.deep_replace(block, block.with_changes(body=body))
    if not isinstance(edited, cst.Module):
        return None
    edited = named[1](edited)
    shifted = line + 1 if positions[made].start.line < line else line
    return set_the_epoch(edited.code, shifted + named[2])


def _importable(module: cst.Module, package: str, name: str):
    """How to name ``package.name`` in ``module``: (the name to call, a function adding
    what import it needs, the lines that adds), by an existing ``from package import``
    (the name joined to it), else ``import torch`` (the dotted name); None otherwise."""
    for imported in _nodes(module, cst.ImportFrom):
        if imported.module is not None and _dotted(imported.module) == package and \
                not isinstance(imported.names, cst.ImportStar):
            names = list(imported.names)
            if any(_dotted(a.name) == name for a in names):
                return name, lambda tree: tree, 0
            joined = imported.with_changes(names=[*names[:-1], names[-1].with_changes(
                comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                cst.ImportAlias(cst.Name(name))])
            return name, lambda tree: tree.deep_replace(imported, joined), 0
    if _module_alias(module, "torch") == "torch":
        return f"{package}.{name}", lambda tree: tree, 0
    return None


def evaluate_the_module(source: str, line: int, also: tuple[int, ...] = ()) -> str | None:
    """collective-mismatch from a forward through the DDP wrapper on some ranks only (an
    evaluation under a rank guard): DDP's forward makes collectives the other ranks never
    make there. The statement at ``line`` calls the wrapped module instead
    (``model.module(...)``), under ``torch.no_grad()``: no collective, no graph."""
    tree, positions, parents = _parsed(source)
    wrappers = _wrapper_names(tree)
    torch = _module_alias(tree, "torch")
    statement = next(iter(_statements_at(tree, positions, line)), None)
    if statement is None or torch is None or _enclosing(statement, parents, cst.If) is None:
        return None  # (a forward on every rank is not this cause)
    calls = [c for c in _nodes(statement, cst.Call)
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
    return _code(tree.deep_replace(block, block.with_changes(body=body)))


def sync_the_last(source: str, line: int, also: tuple[int, ...] = ()) -> str | None:
    """sync-every-microbatch: the micro-batch loop around ``line`` (``for i in
    range(n):``) runs its forward and backward (from ``line`` to the statement holding
    ``.backward()``) inside ``model.no_sync()`` for every micro-batch but the last, whose
    backward synchronises the accumulated gradients once."""
    tree, positions, parents = _parsed(source)
    first = next(iter(_statements_at(tree, positions, line)), None)
    if first is None:
        return None
    loop = _enclosing(first, parents, cst.For)
    if loop is None or not isinstance(loop.body, cst.IndentedBlock) or \
            parents.get(first) is not loop.body or not isinstance(loop.target, cst.Name) or \
            not m.matches(loop.iter, m.Call(func=m.Name("range"), args=[m.Arg()])):
        return None
    wrappers = _wrapper_names(tree)
    model = next((c.func.value for c in _nodes(first, cst.Call)
                  if isinstance(c.func, cst.Name) and c.func.value in wrappers), None)
    body: list[cst.BaseStatement] = list(loop.body.body)
    start = body.index(first)
    end = next((i for i in range(start, len(body)) if any(
        isinstance(c.func, cst.Attribute) and c.func.attr.value == "backward"
        for c in _nodes(body[i], cst.Call))), None)
    if model is None or end is None:
        return None
    code = cst.Module(body=[]).code_for_node
    assert isinstance(loop.iter, cst.Call)
    count = loop.iter.args[0].value
    last = str(int(count.value) - 1) if isinstance(count, cst.Integer) else \
        f"{code(count)} - 1"
    needs_import = _module_alias(tree, "contextlib") is None
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
        edited = _with_import(edited, "contextlib")
    return edited.code


def _wrapper_names(module: cst.Module) -> set[str]:
    """The names bound to a DistributedDataParallel(...) (or DDP(...)) the script makes."""
    return {a.targets[0].target.value for a in _nodes(module, cst.Assign)
            if len(a.targets) == 1 and isinstance(a.targets[0].target, cst.Name)
            and isinstance(a.value, cst.Call)
            and _called_name(a.value.func) in ("DistributedDataParallel", "DDP")}


def _with_import(module: cst.Module, name: str) -> cst.Module:
    """``import NAME`` on a line of its own, first among the module's imports (after its
    docstring and ``from __future__``)."""
    body = list(module.body)
    at = next((i for i, s in enumerate(body) if isinstance(s, cst.SimpleStatementLine)
               and any(isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body)
               and not m.matches(s.body[0], m.ImportFrom(module=m.Name("__future__")))),
              len(body))
    added = cst.parse_statement(f"import {name}\n")
    if at < len(body):
        added = added.with_changes(leading_lines=body[at].leading_lines)
        body[at] = body[at].with_changes(leading_lines=[])
    body.insert(at, added)
    return module.with_changes(body=body)


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


# the remedies by the cause they cure (models.CauseKind)
REMEDIES: dict[str, Remedy] = {
    "gradient-not-averaged": average_the_sum,
    "repeated-epoch-order": set_the_epoch,
    "unused-parameters": find_unused,
    "failed-sync": wait_before_step,
    "divergent-parameters": broadcast_after_construction,
    "p2p-cycle": alternate_the_pair,
    "duplicate-samples": shard_the_loader,
    "collective-mismatch": evaluate_the_module,
    "sync-every-microbatch": sync_the_last,
}


def _parsed(source: str):
    """The script's tree, and where each node is and what holds it."""
    wrapper = cst.metadata.MetadataWrapper(cst.parse_module(source))
    return wrapper.module, wrapper.resolve(PositionProvider), \
        wrapper.resolve(ParentNodeProvider)


def _loop_over_a_name(module: cst.Module, positions, line: int
                      ) -> tuple[cst.For, str] | None:
    """The ``for ... in NAME:`` loop at ``line`` (over a loader) and NAME, else None."""
    loop = next((node for node in _nodes(module, cst.For)
                 if positions[node].start.line == line), None)
    if loop is None or not isinstance(loop.iter, cst.Name):
        return None
    return loop, loop.iter.value


def _nodes(module: cst.CSTNode, kind: type) -> list:
    found: list = []

    class Collect(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if isinstance(node, kind):
                found.append(node)
            return True

    module.visit(Collect())
    return found


def _statements_at(module: cst.Module, positions, line: int) -> list[cst.SimpleStatementLine]:
    return [s for s in _nodes(module, cst.SimpleStatementLine)
            if positions[s].start.line == line]


def _only_call(statement: cst.SimpleStatementLine) -> cst.Call | None:
    """The call a statement is, alone (``dist.all_reduce(p.grad)``), else None."""
    if len(statement.body) == 1 and isinstance(statement.body[0], cst.Expr) and \
            isinstance(statement.body[0].value, cst.Call):
        return statement.body[0].value
    return None


def _called_name(func: cst.BaseExpression) -> str | None:
    return func.attr.value if isinstance(func, cst.Attribute) else \
        func.value if isinstance(func, cst.Name) else None


def _insert_after(module: cst.Module, parents, statement: cst.BaseStatement,
                  new: cst.BaseStatement) -> str | None:
    block = parents[statement]
    if not isinstance(block, (cst.IndentedBlock, cst.Module)):
        return None  # a one-line suite (``for p in ps: all_reduce(p)``): left alone
    body: list[cst.BaseStatement] = list(block.body)
    body.insert(body.index(statement) + 1, new)
    return _code(module.deep_replace(block, block.with_changes(body=body)))


def _code(node: cst.CSTNode) -> str | None:
    """A module's source after an edit (deep_replace gives back the module it edited)."""
    return node.code if isinstance(node, cst.Module) else None


def _enclosing(node: cst.CSTNode, parents, kind: type):
    parent = parents.get(node)
    while parent is not None and not isinstance(parent, kind):
        parent = parents.get(parent)
    return parent


def _sampler_of(module: cst.Module, loader: str) -> str | None:
    """The name given as ``sampler=`` where ``loader = DataLoader(...)`` is made."""
    for assign in _nodes(module, cst.Assign):
        if len(assign.targets) == 1 and m.matches(assign.targets[0].target, m.Name(loader)) \
                and isinstance(assign.value, cst.Call) and \
                _called_name(assign.value.func) == "DataLoader":
            for arg in assign.value.args:
                if arg.keyword is not None and arg.keyword.value == "sampler" and \
                        isinstance(arg.value, cst.Name):
                    return arg.value.value
    return None
