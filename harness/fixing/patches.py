"""Patches for a report's findings: proposed by the remedies, verified by a re-run of the
patched copy, offered only once verified.

A proposal is an edit of the user's file at the line a finding names (remedies.py). A
patch is verified when the same command, run on a copy of the script's folder with the
edits in place, no longer reports the causes it cures and reports nothing it did not
before. Until then it is never shown as a fix, never saved, never applied.
"""

from __future__ import annotations

import difflib
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from distdoctor.fixing.remedies import REMEDIES

# causes that also follow from others (replicas part after any failed sync): patched only
# where the report names them as the cause, never beside the cause they follow from
FOLLOWERS = {"divergent-parameters"}
# causes whose cure is no edit of a line: a judgement about the user's own work
NO_MECHANICAL_EDIT = {
    "busy-rank": "a rank busy in its own code: what to move off the path is a design choice",
    "straggler": "a rank slower than the others: where its time goes is the user's to cut",
    "unbalanced-stages": "a pipeline cut into unequal stages: where to cut is the user's "
                         "to measure (a stage's layers, their time per micro-batch)",
    "rank-crashed": "a crash in the user's own logic: its traceback names what to mend",
    "hang-unknown": "nothing proves a cause: no edit could be checked against one",
    "non-finite": "a value that is not finite: where it comes from (the data, a learning "
                  "rate, an overflow) is the user's to mend",
}


@dataclass(frozen=True)
class Finding:
    """What a patch needs of a report's cause: its kind and the line it names."""

    kind: str
    where: str | None  # "file.py:LINE", relative to the directory the command ran in
    also_at: tuple[str, ...] = ()  # the cause's other lines, alike

    @classmethod
    def of(cls, cause) -> Finding:
        """A report's cause (``kind``, ``where``, ``also_at``), as a patch needs it."""
        return cls(cause.kind, cause.where, tuple(cause.also_at))


@dataclass(frozen=True)
class Proposal:
    """Edits of one file, for the causes they cure, not yet verified."""

    path: Path
    before: str
    after: str
    cures: tuple[str, ...]

    def diff(self, name: str) -> str:
        """The unified diff, with the file named as the user named it."""
        return "".join(difflib.unified_diff(self.before.splitlines(True),
                                            self.after.splitlines(True),
                                            f"a/{name}", f"b/{name}"))


@dataclass(frozen=True)
class Outcome:
    """A proposal after its re-run: verified or not, and what the re-run said."""

    proposal: Proposal
    verified: bool
    rerun: str  # the re-run's verdict, one line
    diff: str
    remaining: tuple[str, ...] = field(default=())  # causes the re-run still reported


def propose(findings: Sequence[Finding], script: Path | None, cwd: Path
            ) -> tuple[Proposal | None, list[str]]:
    """One proposal for the script's file (the edits of every finding it can cure, made
    from the bottom up so that each line is still where the report saw it), and a line for
    each finding left without one, saying why."""
    said: list[str] = []
    edits: list[tuple[int, str, tuple[int, ...]]] = []
    for index, finding in enumerate(findings):
        if index and finding.kind in FOLLOWERS:
            said.append(f"{finding.kind}: follows from {findings[0].kind}, no patch of its own")
            continue
        if finding.kind in NO_MECHANICAL_EDIT:
            said.append(f"{finding.kind}: no mechanical edit is safe "
                        f"({NO_MECHANICAL_EDIT[finding.kind]})")
            continue
        if finding.kind not in REMEDIES:
            said.append(f"{finding.kind}: no patch yet; the report's fix says what to change")
            continue
        place = _place(finding.where, cwd)
        if place is None or script is None or place[0] != script.resolve():
            said.append(f"{finding.kind}: its line is not in "
                        f"{script.name if script else 'a file the command names'}: no patch")
            continue
        also = tuple(p[1] for p in (_place(w, cwd) for w in finding.also_at)
                     if p is not None and p[0] == place[0])
        edits.append((place[1], finding.kind, also))
    if not edits or script is None:  # (no edit has a file: each finding said why)
        return None, said
    before = script.read_text()
    after, cures = before, list[str]()
    for line, kind, also in sorted(edits, reverse=True):
        edited = REMEDIES[kind](after, line, also)
        if edited is None or edited == after:
            said.append(f"{kind}: the code at {script.name}:{line} is not a shape its remedy "
                        f"knows: make the report's fix by hand")
            continue
        after, cures = edited, [*cures, kind]
    if not cures:
        return None, said
    return Proposal(script.resolve(), before, after, tuple(reversed(cures))), said


def target(findings: Sequence[Finding], cwd: Path) -> Path | None:
    """The file a patch of a command's run edits: the one the first cause a remedy may
    cure names (a command names no script of its own)."""
    for finding in findings:
        place = _place(finding.where, cwd)
        if finding.kind in REMEDIES and place is not None:
            return place[0]
    return None


def verify(proposal: Proposal, name: str, rerun: Callable[[Path], tuple[str, list[str]]],
           before: Sequence[str]) -> Outcome:
    """Run the patched copy (``rerun(script)``: its verdict line and cause kinds) in a
    copy of the script's folder; verified when none of the causes it cures remains and
    nothing new appears (``before``: the first run's cause kinds)."""
    with tempfile.TemporaryDirectory(prefix="distdoctor-fix-") as scratch:
        copy = Path(scratch) / proposal.path.parent.name
        shutil.copytree(proposal.path.parent, copy, ignore=_not_code, symlinks=True)
        patched = copy / proposal.path.name
        patched.write_text(proposal.after)
        verdict, kinds = rerun(patched)
    remaining = tuple(k for k in kinds if k in proposal.cures)
    new = tuple(k for k in kinds if k not in before)
    return Outcome(proposal, not remaining and not new, verdict, proposal.diff(name),
                   remaining + new)


def apply(proposal: Proposal) -> Path:
    """Write a verified proposal into the user's file, the original kept beside it as
    FILE.orig (never overwritten: a second --apply keeps the first original)."""
    backup = proposal.path.with_name(proposal.path.name + ".orig")
    if proposal.path.read_text() != proposal.before:
        raise OSError(f"{proposal.path} changed while its patch was verified: not applied")
    if not backup.exists():
        shutil.copy2(proposal.path, backup)
    proposal.path.write_text(proposal.after)
    return backup


def _place(where: str | None, cwd: Path) -> tuple[Path, int] | None:
    if not where:
        return None
    path, _, line = where.rpartition(":")
    if not line.isdigit():
        return None
    file = (cwd / path).resolve()
    return (file, int(line)) if file.is_file() else None


def _not_code(folder: str, names: list[str]) -> list[str]:
    """What the copy leaves out: all but what the script can import from its folder (its
    sibling Python files, and the packages beside it: folders with an ``__init__.py``),
    so a script in a home folder copies its own code, not the home folder. The re-run
    starts in the same working directory, so relative data paths still reach the user's
    own data."""
    return [n for n in names if not (n.endswith(".py") and (Path(folder) / n).is_file()
                                     or (Path(folder) / n / "__init__.py").is_file())]
