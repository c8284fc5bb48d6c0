"""Remedies for what each rank reads: a sampler never told the epoch, a loader that reads
the whole dataset on every rank."""

from __future__ import annotations

import libcst as cst
from libcst import matchers as m

from distdoctor.fixing.syntax import (
    called_name,
    enclosing,
    importable,
    loop_over_a_name,
    nodes,
    parsed,
    source_of,
    with_argument,
)


def set_the_epoch(source: str, line: int, also: tuple[int, ...] = ()) -> str | None:
    """repeated-epoch-order: the loader iterated at ``line`` draws from a
    DistributedSampler; within the loop around it (the epoch loop), just before the loop
    over the loader, tell the sampler the epoch: ``sampler.set_epoch(epoch)``, by the name
    the script gave it, or as ``loader.sampler`` where it made the sampler inline. Not at
    the epoch's head: a sampler made anew each epoch exists only from its own line on."""
    tree, positions, parents = parsed(source)
    found = loop_over_a_name(tree, positions, line)
    if found is None:
        return None
    loop, loader = found
    sampler = _sampler_of(tree, loader) or f"{loader}.sampler"
    outer = enclosing(loop, parents, cst.For)
    if outer is None or not isinstance(outer.target, cst.Name) or \
            not isinstance(outer.body, cst.IndentedBlock):
        return None
    if any(called_name(c.func) == "set_epoch" for c in nodes(outer, cst.Call)):
        return None  # told already (with a constant, maybe): not a mechanical edit
    call = cst.parse_statement(f"{sampler}.set_epoch({outer.target.value})\n")
    block = parents[loop]
    if not isinstance(block, cst.IndentedBlock):
        return None
    body: list[cst.BaseStatement] = list(block.body)
    at = body.index(loop)
    body[at:at] = [call.with_changes(leading_lines=loop.leading_lines)]
    body[at + 1] = loop.with_changes(leading_lines=[])
    return source_of(tree.deep_replace(block, block.with_changes(body=body)))


def shard_the_loader(source: str, line: int, also: tuple[int, ...] = ()) -> str | None:
    """duplicate-samples: the loader iterated at ``line`` reads the whole dataset on every
    rank. It is given a DistributedSampler of its dataset (its ``shuffle`` moved onto the
    sampler), made just before it, and the sampler is told the epoch at the head of the
    loop around (set_the_epoch), as every sharded loader must be."""
    tree, positions, parents = parsed(source)
    found = loop_over_a_name(tree, positions, line)
    if found is None:
        return None
    loop, loader = found
    made = next((s for s in nodes(tree, cst.SimpleStatementLine)
                 if len(s.body) == 1 and isinstance(s.body[0], cst.Assign)
                 and m.matches(s.body[0], m.Assign(targets=[m.AssignTarget(
                     target=m.Name(loader))], value=m.Call()))), None)
    call = made.body[0].value if made is not None and \
        isinstance(made.body[0], cst.Assign) else None
    if made is None or not isinstance(call, cst.Call) or \
            called_name(call.func) != "DataLoader" or not call.args or \
            call.args[0].keyword is not None or any(
                a.keyword is not None and a.keyword.value in ("sampler", "batch_sampler")
                for a in call.args):
        return None
    named = importable(tree, "torch.utils.data", "DistributedSampler")
    if named is None:
        return None
    used = {n.value for n in nodes(tree, cst.Name)}
    sampler = next(n for n in ("sampler", "train_sampler", "shard_sampler") if n not in used)
    shuffle = next((a.value for a in call.args if a.keyword is not None
                    and a.keyword.value == "shuffle"), None)
    code = cst.Module(body=[]).code_for_node
    made_sampler = cst.parse_statement(
        f"{sampler} = {named[0]}({code(call.args[0].value)}"
        f"{', shuffle=' + code(shuffle) if shuffle is not None else ''})\n")
    args = [a for a in call.args if a.keyword is None or a.keyword.value != "shuffle"]
    told = made.with_changes(body=[made.body[0].with_changes(value=with_argument(
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


def _sampler_of(module: cst.Module, loader: str) -> str | None:
    """The name given as ``sampler=`` where ``loader = DataLoader(...)`` is made."""
    for assign in nodes(module, cst.Assign):
        if len(assign.targets) == 1 and m.matches(assign.targets[0].target, m.Name(loader)) \
                and isinstance(assign.value, cst.Call) and \
                called_name(assign.value.func) == "DataLoader":
            for arg in assign.value.args:
                if arg.keyword is not None and arg.keyword.value == "sampler" and \
                        isinstance(arg.value, cst.Name):
                    return arg.value.value
    return None
