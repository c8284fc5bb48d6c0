"""Remedies for a decision one rank makes alone: a call under a rank guard (``if rank ==
0:``), a skip that one rank's loss decides, a loop whose length differs by rank. Each
makes the decision the same on every rank: the call made by all (its result still used by
the one), the flag or the count agreed by an all-reduce first.
"""

from __future__ import annotations

import libcst as cst
from libcst import matchers as m

from distdoctor.fixing.syntax import (
    called_name,
    enclosing,
    module_alias,
    nodes,
    parsed,
    source_of,
    statements_at,
    with_import,
    wrapper_names,
)

# the words a name or attribute ends with when it holds a rank (rank, local_rank,
# dist.get_rank(), args.local_rank, os.environ["RANK"])
RANK_WORD = "rank"
# and the names the field gives "this is rank 0" (accelerate's is_main_process, nanoGPT's
# master_process, is_master)
MAIN_WORDS = ("main_process", "is_main", "is_master", "master_process")


def out_of_the_guard(source: str, line: int, also: tuple[int, ...] = ()) -> str | None:
    """A call under a rank guard (a collective only rank 0 makes, a clip or scheduler step
    only rank 0 applies): the statement at ``line``, with those earlier in the guard that
    it needs, is made on every rank, just before the guard. What else the guard's
    condition says (``and step == 1``) still guards it; the guard keeps its other
    statements (a print, a save), and goes where it keeps none."""
    tree, positions, parents = parsed(source)
    statement = next(iter(statements_at(tree, positions, line)), None)
    if statement is None:
        return None
    ranked = rank_names(tree)
    child: cst.CSTNode = statement
    guard = None
    while (parent := parents.get(child)) is not None:
        holder = parents.get(parent) if isinstance(parent, cst.IndentedBlock) else None
        if isinstance(holder, cst.If) and holder.body is parent and \
                names_the_rank(holder.test, ranked):
            guard = holder
            break
        child = parent
    outer = parents.get(guard) if guard is not None else None
    if guard is None or not isinstance(outer, (cst.IndentedBlock, cst.Module)) or \
            not isinstance(guard.body, cst.IndentedBlock) or \
            not isinstance(child, cst.BaseStatement):
        return None  # no rank guard, or one that is an elif or a one-line suite
    inside: list[cst.BaseStatement] = list(guard.body.body)
    moved = _needed(inside, inside.index(child))
    kept = [s for i, s in enumerate(inside) if i not in moved]
    if not kept and guard.orelse is not None:
        return None  # (an else with nothing left to guard: the user's to restructure)
    rest = [c for c in _conjuncts(guard.test) if not names_the_rank(c, ranked)]
    hoisted = [inside[i] for i in sorted(moved)]
    code = cst.Module(body=[]).code_for_node
    made: list[cst.BaseStatement] = hoisted
    if rest:
        test = cst.parse_expression(" and ".join(code(c) for c in rest))
        made = [cst.If(test=test, body=guard.body.with_changes(  # (its comment stays)
            body=hoisted, header=cst.TrailingWhitespace()))]
    body: list[cst.BaseStatement] = list(outer.body)
    at = body.index(guard)
    rebuilt = [guard.with_changes(body=guard.body.with_changes(body=kept))] if kept else []
    if not kept:
        made = [made[0].with_changes(leading_lines=guard.leading_lines), *made[1:]]
    body[at:at + 1] = [*made, *rebuilt]
    return source_of(tree.deep_replace(outer, outer.with_changes(body=body)))


def agree_on_the_skip(source: str, line: int, also: tuple[int, ...] = ()) -> str | None:
    """partial-step: the ``continue`` (or ``break``, ``return``) at ``line`` is taken when
    a condition one rank may see alone holds (its own loss not finite). The condition is
    made a flag and all-reduced with MAX first, so every rank skips when any rank would:
    ``skip = torch.tensor([float(COND)])``, ``dist.all_reduce(skip, op=MAX)``,
    ``if skip.item():``."""
    tree, positions, parents = parsed(source)
    statement = next(iter(statements_at(tree, positions, line)), None)
    if statement is None or not m.matches(statement, m.SimpleStatementLine(
            body=[m.OneOf(m.Continue(), m.Break(), m.Return())])):
        return None
    block = parents.get(statement)
    guard = parents.get(block) if isinstance(block, cst.IndentedBlock) else None
    outer = parents.get(guard) if isinstance(guard, cst.If) else None
    torch, dist = module_alias(tree, "torch"), module_alias(tree, "torch.distributed")
    if not isinstance(guard, cst.If) or guard.body is not block or torch is None or \
            dist is None or not isinstance(outer, (cst.IndentedBlock, cst.Module)):
        return None
    flag = _unused(tree, "skip", "skip_flag", "skip_step")
    code = cst.Module(body=[]).code_for_node
    return _agreed_before(tree, outer, guard, (torch, dist), flag,
                          f"float({code(guard.test)})", "MAX", guard.with_changes(
                              test=cst.parse_expression(f"{flag}.item()")))


def agree_on_the_steps(source: str, line: int, also: tuple[int, ...] = ()) -> str | None:
    """rank-exited-early from a loop whose length differs by rank (``for step in
    range(batches)``, ``batches`` each rank's own): the loop around ``line`` runs the
    fewest steps any rank has, agreed by an all-reduce with MIN first (the last batches
    of the longer shards dropped, as DistributedSampler(drop_last=True) does). A loop of
    a fixed length is not this cause."""
    tree, positions, parents = parsed(source)
    statement = next(iter(statements_at(tree, positions, line)), None)
    loop = enclosing(statement, parents, cst.For) if statement is not None else None
    torch, dist = module_alias(tree, "torch"), module_alias(tree, "torch.distributed")
    outer = parents.get(loop) if loop is not None else None
    if loop is None or torch is None or dist is None or \
            not isinstance(outer, (cst.IndentedBlock, cst.Module)) or \
            not m.matches(loop.iter, m.Call(func=m.Name("range"), args=[m.Arg(keyword=None)])):
        return None
    assert isinstance(loop.iter, cst.Call)
    count = loop.iter.args[0].value
    if isinstance(count, cst.Integer):
        return None
    steps = _unused(tree, "steps", "agreed_steps", "fewest_steps")
    code = cst.Module(body=[]).code_for_node
    ranged = loop.iter.with_changes(args=[loop.iter.args[0].with_changes(
        value=cst.parse_expression(f"int({steps}.item())"))])
    return _agreed_before(tree, outer, loop, (torch, dist), steps, code(count), "MIN",
                          loop.with_changes(iter=ranged))


def _agreed_before(tree: cst.Module, outer: cst.IndentedBlock | cst.Module,
                   statement: cst.If | cst.For, aliases: tuple[str, str], name: str,
                   value: str, op: str, replaced: cst.If | cst.For) -> str | None:
    """``statement`` replaced by ``replaced``, after ``NAME = torch.tensor([VALUE])`` and
    its all-reduce with ``op`` (MAX: any rank's flag; MIN: the fewest steps), which take
    over the statement's leading comments."""
    torch, dist = aliases
    agreed = [cst.parse_statement(f"{name} = {torch}.tensor([{value}])\n"),
              cst.parse_statement(f"{dist}.all_reduce({name}, op={dist}.ReduceOp.{op})\n")]
    agreed[0] = agreed[0].with_changes(leading_lines=statement.leading_lines)
    body: list[cst.BaseStatement] = list(outer.body)
    at = body.index(statement)
    body[at:at + 1] = [*agreed, replaced.with_changes(leading_lines=[])]
    return source_of(tree.deep_replace(outer, outer.with_changes(body=body)))


def join_the_uneven(source: str, line: int, also: tuple[int, ...] = ()) -> str | None:
    """rank-exited-early under DDP from uneven inputs (a rank's shard ran out first): the
    loop around ``line``, whose forward goes through the DDP wrapper, runs inside
    ``with Join([model]):``, torch's answer: a rank that ran out shadows the others'
    gradient all-reduces until every rank is done."""
    tree, positions, parents = parsed(source)
    statement = next(iter(statements_at(tree, positions, line)), None)
    loop = enclosing(statement, parents, cst.For) if statement is not None else None
    outer = parents.get(loop) if loop is not None else None
    if loop is None or not isinstance(outer, (cst.IndentedBlock, cst.Module)):
        return None
    used = [n for n in wrapper_names(tree)
            if any(isinstance(c.func, cst.Name) and c.func.value == n
                   for c in nodes(loop, cst.Call))]
    if len(used) != 1 or any(called_name(c.func) == "Join" for c in nodes(tree, cst.Call)):
        return None  # (no forward through one wrapper in the loop, or joined already)
    joined = cst.parse_statement(f"with Join([{used[0]}]):\n    pass\n")
    assert isinstance(joined, cst.With) and isinstance(joined.body, cst.IndentedBlock)
    body: list[cst.BaseStatement] = list(outer.body)
    body[body.index(loop)] = joined.with_changes(
        body=joined.body.with_changes(body=[loop.with_changes(leading_lines=[])]),
        leading_lines=loop.leading_lines)
    edited = tree.deep_replace(outer, outer.with_changes(body=body))
    if not isinstance(edited, cst.Module):
        return None
    return with_import(edited, "from torch.distributed.algorithms.join import Join",
                       last=True).code


def rank_names(module: cst.Module) -> set[str]:
    """The names that hold a rank: named so (``rank``, ``local_rank``), or bound to what
    names one (``master = rank == 0``, ``rank, world = dist.get_rank(), ...``)."""
    found = {n.value for n in nodes(module, cst.Name)
             if n.value.lower().endswith((RANK_WORD, *MAIN_WORDS))}
    assigns = nodes(module, cst.Assign)
    functions = nodes(module, cst.FunctionDef)
    while True:
        more = set(found)
        for function in functions:  # ``def is_main(): return dist.get_rank() == 0``
            if any(r.value is not None and names_the_rank(r.value, found)
                   for r in nodes(function, cst.Return)):
                more.add(function.name.value)
        for assign in assigns:
            for target in assign.targets:
                for name, value in _pairs(target.target, assign.value):
                    if isinstance(name, cst.Name) and names_the_rank(value, found):
                        more.add(name.value)
        if more == found:
            return found
        found = more


def _pairs(target: cst.BaseExpression, value: cst.BaseExpression
           ) -> list[tuple[cst.BaseExpression, cst.BaseExpression]]:
    """What each name of an assignment is bound to: element by element for ``a, b = x,
    y``, else the whole value."""
    if isinstance(target, cst.Tuple) and isinstance(value, cst.Tuple) and \
            len(target.elements) == len(value.elements):
        return [(t.value, v.value) for t, v in zip(target.elements, value.elements)]
    return [(target, value)]


def names_the_rank(node: cst.CSTNode, ranked: set[str]) -> bool:
    """Whether an expression depends on the rank: a name that holds one, an attribute or
    a call named for one (``args.local_rank``, ``dist.get_rank()``), ``os.environ["RANK"]``."""
    if any(n.value in ranked for n in nodes(node, cst.Name)):
        return True
    if any((called_name(c.func) or "").lower().endswith(RANK_WORD)
           for c in nodes(node, cst.Call)):
        return True
    if any(a.attr.value.lower().endswith((RANK_WORD, *MAIN_WORDS))
           for a in nodes(node, cst.Attribute)):
        return True
    return any(RANK_WORD.upper() in s.value for s in nodes(node, cst.SimpleString))


def _conjuncts(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    """``A and B and C`` as [A, B, C]; any other test as itself."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return [*_conjuncts(test.left), *_conjuncts(test.right)]
    return [test]


def _needed(body: list[cst.BaseStatement], at: int) -> set[int]:
    """The statement at ``at`` and those before it in ``body`` that bind a name it (or
    another needed one) uses: what must move with it."""
    needed = {at}
    for index in range(at - 1, -1, -1):
        used = {n.value for i in needed for n in nodes(body[i], cst.Name)}
        if _bound(body[index]) & used:
            needed.add(index)
    return needed


def _bound(statement: cst.BaseStatement) -> set[str]:
    targets = [t.target for a in nodes(statement, cst.Assign) for t in a.targets] + \
        [a.target for a in nodes(statement, (cst.AugAssign, cst.AnnAssign))]
    return {n.value for t in targets for n in nodes(t, cst.Name)}


def _unused(module: cst.Module, *choices: str) -> str:
    used = {n.value for n in nodes(module, cst.Name)}
    return next((c for c in choices if c not in used), f"{choices[0]}_{len(used)}")
