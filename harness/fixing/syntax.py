"""What the remedies share about a script's concrete syntax tree: finding the statements
at a line, the names a module binds, and making an edit that keeps every byte it is not
told to change."""

from __future__ import annotations

import libcst as cst
from libcst import matchers as m
from libcst.metadata import ParentNodeProvider, PositionProvider


def parsed(source: str):
    """The script's tree, and where each node is and what holds it."""
    wrapper = cst.metadata.MetadataWrapper(cst.parse_module(source))
    return wrapper.module, wrapper.resolve(PositionProvider), \
        wrapper.resolve(ParentNodeProvider)


def nodes(module: cst.CSTNode, kind: type | tuple[type, ...]) -> list:
    found: list = []

    class Collect(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if isinstance(node, kind):
                found.append(node)
            return True

    module.visit(Collect())
    return found


def statements_at(module: cst.Module, positions, line: int) -> list[cst.SimpleStatementLine]:
    return [s for s in nodes(module, cst.SimpleStatementLine)
            if positions[s].start.line == line]


def only_call(statement: cst.SimpleStatementLine) -> cst.Call | None:
    """The call a statement is, alone (``dist.all_reduce(p.grad)``), else None."""
    if len(statement.body) == 1 and isinstance(statement.body[0], cst.Expr) and \
            isinstance(statement.body[0].value, cst.Call):
        return statement.body[0].value
    return None


def called_name(func: cst.BaseExpression) -> str | None:
    return func.attr.value if isinstance(func, cst.Attribute) else \
        func.value if isinstance(func, cst.Name) else None


def insert_after(module: cst.Module, parents, statement: cst.BaseStatement,
                  new: cst.BaseStatement) -> str | None:
    block = parents[statement]
    if not isinstance(block, (cst.IndentedBlock, cst.Module)):
        return None  # a one-line suite (``for p in ps: all_reduce(p)``): left alone
    body: list[cst.BaseStatement] = list(block.body)
    body.insert(body.index(statement) + 1, new)
    return source_of(module.deep_replace(block, block.with_changes(body=body)))


def source_of(node: cst.CSTNode) -> str | None:
    """A module's source after an edit (deep_replace gives back the module it edited)."""
    return node.code if isinstance(node, cst.Module) else None


def enclosing(node: cst.CSTNode, parents, kind: type):
    parent = parents.get(node)
    while parent is not None and not isinstance(parent, kind):
        parent = parents.get(parent)
    return parent


def module_alias(module: cst.Module, package: str) -> str | None:
    """The name ``import PACKAGE as NAME`` binds (or PACKAGE itself, imported plainly)."""
    for imported in nodes(module, cst.Import):
        for alias in imported.names:
            if dotted(alias.name) == package:
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    return alias.asname.name.value
                return package
    return None


def dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{dotted(node.value)}.{node.attr.value}"
    return ""


def with_argument(call: cst.Call, added: cst.Arg) -> cst.Call:
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


def with_import(module: cst.Module, statement: str, last: bool = False) -> cst.Module:
    """An import statement (``import contextlib``) on a line of its own, first among the
    module's imports (after its docstring and ``from __future__``), or, ``last``, after
    them (a ``from torch... import`` after the ``import torch`` it needs)."""
    body = list(module.body)
    imports = [i for i, s in enumerate(body) if isinstance(s, cst.SimpleStatementLine)
               and any(isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body)
               and not m.matches(s.body[0], m.ImportFrom(module=m.Name("__future__")))]
    added = cst.parse_statement(f"{statement}\n")
    if last and imports:
        body.insert(imports[-1] + 1, added)
        return module.with_changes(body=body)
    at = imports[0] if imports else len(body)
    if at < len(body):
        added = added.with_changes(leading_lines=body[at].leading_lines)
        body[at] = body[at].with_changes(leading_lines=[])
    body.insert(at, added)
    return module.with_changes(body=body)


def importable(module: cst.Module, package: str, name: str):
    """How to name ``package.name`` in ``module``: (the name to call, a function adding
    what import it needs, the lines that adds), by an existing ``from package import``
    (the name joined to it), else ``import torch`` (the dotted name); None otherwise."""
    for imported in nodes(module, cst.ImportFrom):
        if imported.module is not None and dotted(imported.module) == package and \
                not isinstance(imported.names, cst.ImportStar):
            names = list(imported.names)
            if any(dotted(a.name) == name for a in names):
                return name, lambda tree: tree, 0
            joined = imported.with_changes(names=[*names[:-1], names[-1].with_changes(
                comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                cst.ImportAlias(cst.Name(name))])
            return name, lambda tree: tree.deep_replace(imported, joined), 0
    if module_alias(module, "torch") == "torch":
        return f"{package}.{name}", lambda tree: tree, 0
    return None


def wrapper_names(module: cst.Module) -> set[str]:
    """The names bound to a DistributedDataParallel(...) (or DDP(...)) the script makes."""
    return {a.targets[0].target.value for a in nodes(module, cst.Assign)
            if len(a.targets) == 1 and isinstance(a.targets[0].target, cst.Name)
            and isinstance(a.value, cst.Call)
            and called_name(a.value.func) in ("DistributedDataParallel", "DDP")}


def loop_over_a_name(module: cst.Module, positions, line: int
                      ) -> tuple[cst.For, str] | None:
    """The ``for ... in NAME:`` loop at ``line`` (over a loader) and NAME, else None."""
    loop = next((node for node in nodes(module, cst.For)
                 if positions[node].start.line == line), None)
    if loop is None or not isinstance(loop.iter, cst.Name):
        return None
    return loop, loop.iter.value
