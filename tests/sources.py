"""Where a line is in a file the tests run (an example, a case file, a job module): one
definition for every test, so a marker or a moved line is found the same way everywhere."""

from __future__ import annotations

import os
from pathlib import Path


def line_number(path: str | Path, text: str) -> int:
    """The number of the first line of ``path`` that holds ``text`` (a marker comment such
    as ``# LINE spin``, or the code itself); LookupError when none does."""
    with open(path) as source:
        for number, line in enumerate(source, 1):
            if text in line:
                return number
    raise LookupError(f"{text!r} is in no line of {path}")


def line_of(path: str | Path, text: str, base: str | Path | None = None) -> str:
    """``file:line`` of that line, the file written relative to ``base`` (the folder a
    report names files from), or as given when no ``base``."""
    name = os.path.relpath(path, base) if base is not None else str(path)
    return f"{name}:{line_number(path, text)}"
