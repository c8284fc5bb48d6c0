"""Where the ranks' collective sequences part, and which ranks parted from the rest.

In every correct program each member of a group makes the same collectives on it in the
same order: its k-th collective there is every other member's k-th, with the same op, root,
shapes, dtype and reduce op. The first number at which two members differ is where the
program went wrong, whatever happened next: gloo may abort, or pair the calls anyway (an
extra all-reduce of 1 element on one rank meets the others' all-reduce of 4 and lets that
rank through), and from then on a number means something else on each side, so every hang
after it follows from it and every result after it is suspect. The number of calls made
is compared by the hang proof (a member that finished early), not here.

Blame goes to the odd ranks out: the ranks whose call differs from the one a strict
majority made. With no majority (two ranks, or two equal halves) the evidence may still
tell: a side whose next call is the other side's call at this number made an extra call
there, and is to blame; so is a side whose call there came from a line no other rank ran
at all (a rank-dependent branch), while the other side's line is one it ran too.
Otherwise every side is named as such, and every rank blamed.

One module for the live proof (waitfor.py, from the trace's enter events as they come) and
the checks after the fact (from a RunRecord's calls): both describe what a rank made at a
number as a :class:`Made` and ask :func:`parting_at`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Literal, Sequence

from distdoctor.models.calls import describe_call, is_collective, ranks_phrase, relative_line
from distdoctor.models.evidence import Call
from distdoctor.models.record import RankRecord, Recorded

# each rank passes its own split sizes: their shapes differ in correct programs (as the
# tracer names them, and as gloo's Flight Recorder does)
UNEVEN = frozenset({"all_to_all", "all_to_all_single", "alltoall", "alltoall_base"})
# the tensor a rank passes is one of the list the others see (the root alone passes the
# list of a gather or scatter; an uneven all_gather's input is its own entry of the list):
# the set of shapes must agree, not the sequence
ONE_OF_A_LIST = frozenset({"all_gather", "gather", "scatter"})

Blame = Literal["majority", "extra", "own-line", "even"]


def agreement(op: str, peer: int | None, shapes: Iterable, dtype: str,
              reduce_op: str | None) -> tuple:
    """What every member's call at one number of a group must share in a correct program."""
    if op in UNEVEN:
        shown: object = None
    elif op in ONE_OF_A_LIST:
        shown = frozenset(tuple(s) for s in shapes)
    else:
        shown = tuple(tuple(s) for s in shapes)
    return op, peer, shown, dtype, reduce_op or None


@dataclass(frozen=True)
class Made:
    """The call one rank made at one number of a group's sequence."""

    key: tuple  # agreement(...)
    text: str  # the call as every report writes it (describe_call)
    where: str  # its file:line
    entered: float = 0.0  # on the machine-wide monotonic clock, where known


def made(call: Call) -> Made:
    return Made(agreement(call.op, call.peer, call.shapes, call.dtype, call.reduce_op),
                call.describe(relative=True), call.where, call.entered)


@dataclass(frozen=True)
class Side:
    """The ranks that made one and the same call at the number where the group parted."""

    ranks: tuple[int, ...]
    made: Made
    extra: bool = False  # their next call is another side's call here: this one was extra
    own_line: bool = False  # their call came from a line no other rank of the group ran


@dataclass(frozen=True)
class Parting:
    """The first number of a group's collectives at which its members' calls differ."""

    group: tuple[int, ...]  # the group's global ranks (every rank: the default group)
    pg: str | None
    seq: int
    sides: tuple[Side, ...]  # the odd ranks out first, then the rest, largest side first
    culprits: tuple[int, ...]  # the ranks to blame (every side's, with ``blame`` "even")
    blame: Blame  # how: against a strict majority, by an extra call, by a line only the
    # culprits ran, or no side stands out ("even")
    # where it began, when that was earlier: the first of the numbers before ``seq`` at
    # which the culprits' calls came from another line than the others' (the same kind
    # and size, so gloo paired them): (number, the culprits' call, the others' call)
    began: tuple[int, str, str] | None = None
    began_where: tuple[str, str] = ("", "")  # those two calls' lines

    @property
    def lines(self) -> tuple[str, ...]:
        """The lines to look at: the culprits' first, then the others', once each (where
        it began first of all)."""
        found: list[str] = [relative_line(w) for w in self.began_where if w]
        for side in self.sides:
            line = relative_line(side.made.where) if side.made.where else ""
            if line and line not in found:
                found.append(line)
        return tuple(found)

    def sentence(self, world: int) -> str:
        """'ranks 1-15 of 16 made all_reduce (#2, (4,), float32) at train.py:6; rank 0
        made all_reduce (#2, (1,), float32) at train.py:8, an extra call', majority first."""
        ordered = sorted(self.sides, key=lambda s: (-len(s.ranks), s.ranks))
        said = "; ".join(
            f"{ranks_phrase(s.ranks)}{f' of {world}' if i == 0 else ''} made {s.made.text}"
            + (", an extra call" if s.extra else "")
            + (", from a line no other rank ran" if s.own_line else "")
            for i, s in enumerate(ordered))
        if self.began is not None:
            number, theirs, others = self.began
            culprits = ranks_phrase(self.culprits)
            said = (f"at #{number} {culprits} made {theirs} where the others made {others}: "
                    f"the same kind and size, so gloo paired them, and from there the "
                    f"ranks are out of step; at #{self.seq} {said}")
        if self.blame != "even":
            return said
        sizes = {len(s.ranks) for s in self.sides}
        even = "two equal sides" if len(self.sides) == 2 and len(sizes) == 1 else \
            f"{len(self.sides)} sides"
        return f"{even}, no majority: {said}"

    def where_said(self) -> str:
        """'collective #2 of the default group', or of process group NAME (ranks 0-3);
        'current collective', where its number is not known (read from stacks)."""
        what = f"collective #{self.seq}" if self.seq >= 0 else "current collective"
        if self.pg is None:
            return f"{what} of the default group"
        return f"{what} of process group {self.pg} ({ranks_phrase(self.group)})"


def parting_at(group: tuple[int, ...], pg: str | None, seq: int, here: dict[int, Made],
               after: dict[int, Made]) -> Parting | None:
    """The parting at ``seq``, from what each rank made there (``here``) and at the next
    number (``after``, where known); None when every rank made the same call."""
    keys: dict[tuple, list[int]] = {}
    for rank, call in sorted(here.items()):
        keys.setdefault(call.key, []).append(rank)
    if len(keys) < 2:
        return None
    sides = [Side(tuple(ranks), here[ranks[0]], _extra(ranks, key, keys, after))
             for key, ranks in keys.items()]
    sizes = sorted((len(s.ranks) for s in sides), reverse=True)
    blame: Blame
    if sizes[0] > sizes[1]:
        blame = "majority"
        culprits = [r for s in sides if len(s.ranks) < sizes[0] for r in s.ranks]
    elif sum(s.extra for s in sides) == 1:
        blame = "extra"
        culprits = [r for s in sides if s.extra for r in s.ranks]
    else:
        blame = "even"
        culprits = [r for s in sides for r in s.ranks]
    ordered = sorted(sides, key=lambda s: (not set(s.ranks) <= set(culprits) or
                                           blame == "even", -len(s.ranks), s.ranks))
    return Parting(group, pg, seq, tuple(ordered), tuple(sorted(culprits)), blame)


def _extra(ranks: list[int], key: tuple, keys: dict[tuple, list[int]],
           after: dict[int, Made]) -> bool:
    """Did these ranks make an extra call here? Each one's next call is what another side
    made here, and that side did not do the same the other way."""
    others = [k for k in keys if k != key]
    if len(others) != 1 or not all(r in after for r in ranks):
        return False
    theirs = keys[others[0]]
    mine_next = {after[r].key for r in ranks}
    theirs_next = {after[r].key for r in theirs if r in after}
    return mine_next == {others[0]} and theirs_next != {key}


def first_parting(calls: dict[int, Sequence[Call]], world: int,
                  lines: dict[int, set[str]] | None = None) -> Parting | None:
    """The earliest parting in a run's recorded collectives, over every group: of the
    groups that parted, the one whose parting call was entered first."""
    slots: dict[tuple, dict[int, dict[int, Call]]] = {}
    for rank, made_calls in calls.items():
        for call in made_calls:
            if is_collective(call.op):
                slots.setdefault((call.group, call.pg), {}).setdefault(call.seq, {})[rank] \
                    = call
    found = []
    for (group, pg), numbered in slots.items():
        for seq in sorted(numbered):
            here = {r: made(c) for r, c in numbered[seq].items()}
            if len({m.key for m in here.values()}) < 2:
                continue
            after = {r: made(c) for r, c in numbered.get(seq + 1, {}).items()}
            parted = parting_at(group or tuple(range(world)), pg, seq, here, after)
            if parted is not None:
                found.append(by_own_line(parted, lines or {
                    r: {c.where for c in made_calls} for r, made_calls in calls.items()}))
            break
    return min(found, key=lambda p: min(s.made.entered for s in p.sides), default=None)


def recorded_parting(histories: dict[int, tuple[Recorded, ...]], world: int,
                     lines: dict[int, set[str]] | None = None) -> Parting | None:
    """The earliest parting in the ranks' Flight Recorder histories, torch's own
    collectives included (DDP's buffer broadcasts, FSDP's and DTensor's gathers), over the
    numbers every member still holds. Compared are kind, input sizes and dtype (the
    recorder keeps no root or reduce op). Where the culprits' calls came from other lines
    than the others' for a while before (a validation forward's buffer broadcast paired
    with the next training forward's), ``began`` says where that started. None when a
    rank has no history (it ended, or could not answer)."""
    if len(histories) < world or not all(histories.values()):
        return None
    by_group: dict[str | None, dict[int, dict[int, Recorded]]] = {}
    for rank, recorded in histories.items():
        for entry in recorded:
            by_group.setdefault(entry.pg, {}).setdefault(rank, {})[entry.seq] = entry
    found = []
    for pg, ranks in by_group.items():
        if pg is None and len(ranks) < world:
            continue  # the default group holds every rank: some history is missing
        common = sorted(set.intersection(*(set(seqs) for seqs in ranks.values())))
        for seq in common:
            here = {r: _made_recorded(seqs[seq]) for r, seqs in ranks.items()}
            if len({m.key for m in here.values()}) < 2:
                continue
            after = {r: _made_recorded(seqs[seq + 1]) for r, seqs in ranks.items()
                     if seq + 1 in seqs}
            group = tuple(sorted(ranks)) if pg is not None else tuple(range(world))
            parted = parting_at(group, pg, seq, here, after)
            if parted is not None:
                found.append(by_own_line(_began(parted, ranks, common), lines or {
                    r: {e.where for e in seqs.values() if e.where} for r, seqs in ranks.items()}))
            break
    return min(found, key=lambda p: min(s.made.entered for s in p.sides), default=None)


def _made_recorded(entry: Recorded) -> Made:
    return Made(agreement(entry.op, None, entry.sizes, entry.dtype, None),
                describe_call(entry.op, None, entry.seq, entry.sizes, entry.dtype, None,
                              entry.pg, relative_line(entry.where) if entry.where else ""),
                entry.where, float(entry.seq))


def _began(parted: Parting, ranks: dict[int, dict[int, Recorded]], common: list[int]
           ) -> Parting:
    """Walk back from the parting while one side's calls come from another line than the
    other's (the same kind and size each time): where the run first went astray. With no
    culprit yet (two equal sides), the side whose call after that number is the other
    side's call at it, line and all, made an extra call there: it is the culprit."""
    if len(parted.sides) != 2:
        return parted
    first, second = (s.ranks[0] for s in parted.sides)
    if parted.blame != "even":
        first = parted.culprits[0]
        second = next(r for r in sorted(ranks) if r not in parted.culprits)
    number = parted.seq
    while number - 1 in common:
        mine, theirs = ranks[first][number - 1], ranks[second][number - 1]
        if not mine.where or not theirs.where or mine.where == theirs.where:
            break
        number -= 1
    if number == parted.seq:
        return parted
    culprits, blame = parted.culprits, parted.blame
    if blame == "even":  # the side that got ahead by the calls it made extra (a DDP
        # forward makes two broadcasts: buffers, then the batch counter)
        ahead: list[int] = []
        for shift in range(1, 9):
            ahead = [a for a, b in ((first, second), (second, first))
                     if _same(ranks[a].get(number + shift), ranks[b][number])]
            if ahead:
                break
        if len(ahead) != 1:
            return parted
        side = next(s for s in parted.sides if ahead[0] in s.ranks)
        culprits, blame = side.ranks, "extra"
        first, second = ahead[0], second if ahead[0] == first else first
    mine, theirs = ranks[first][number], ranks[second][number]
    sides = tuple(sorted(parted.sides, key=lambda s: not set(s.ranks) <= set(culprits)))
    return Parting(parted.group, parted.pg, parted.seq, sides, tuple(culprits), blame,
                   (number, _made_recorded(mine).text, _made_recorded(theirs).text),
                   (mine.where, theirs.where))


def _same(a: Recorded | None, b: Recorded) -> bool:
    """The same call, line and all (its number aside)?"""
    return a is not None and (a.op, a.sizes, a.dtype, a.where) == (b.op, b.sizes, b.dtype,
                                                                  b.where)


def parting_of(ranks: Sequence[RankRecord]) -> Parting | None:
    """Where the ranks' collectives first parted, by their traced calls, else by their
    Flight Recorders' histories (torch's own collectives included), with every line each
    rank is known to have run. Where the calls show a parting no side of which stands out
    (they are part of the story: a dump's open operations, or only the traced calls) and
    the histories show one side that does, the histories' account is the one to give."""
    world = len(ranks)
    lines = {r.rank: lines_run(r) for r in ranks}
    traced = first_parting({r.rank: r.evidence.calls for r in ranks}, world, lines)
    if traced is not None and traced.blame != "even":
        return traced
    recorded = recorded_parting({r.rank: r.end.recorded for r in ranks}, world, lines)
    if recorded is not None and (traced is None or recorded.blame != "even"):
        return recorded
    return traced


def lines_run(rank: RankRecord) -> set[str]:
    """Every line of the user's a rank is known to have run: its calls', its recorder's,
    its DDP forwards', its loaders' and its optimiser steps'."""
    evidence = rank.evidence
    found = {c.where for c in evidence.calls} | {r.where for r in rank.end.recorded}
    found |= {f.where for f in evidence.ddp_forwards} | {b.where for b in evidence.batches}
    found |= {g.where for g in evidence.gradients}
    return {line for line in found if line}


def by_own_line(parted: Parting, lines: dict[int, set[str]]) -> Parting:
    """Two equal sides: the one whose call came from a line no rank of the other side ran
    (a rank-dependent branch), while the other side's line is one it ran too, is to
    blame. ``lines``: every line each rank is known to have run (lines_run)."""
    if parted.blame != "even" or len(parted.sides) != 2:
        return parted
    alone = []
    for side, other in (parted.sides, parted.sides[::-1]):
        mine, theirs = side.made.where, other.made.where
        if mine and theirs and all(mine not in lines.get(r, set()) for r in other.ranks) \
                and all(theirs in lines.get(r, set()) for r in side.ranks):
            alone.append(side)
    if len(alone) != 1:
        return parted
    culprit = alone[0]
    sides = (replace(culprit, own_line=True),
             *(s for s in parted.sides if s is not culprit))
    return replace(parted, sides=sides, culprits=culprit.ranks, blame="own-line")
