"""Plain text for the terminal, shared by every package that prints: the page width,
paragraph wrapping, and the one line that says how a run's ranks ended.

It sits below the command line so that the planners and reports in ``memory`` and
``pipeline`` can print the same way without importing the command line.
"""

from __future__ import annotations

import textwrap

from distdoctor.models import RunRecord
from distdoctor.models.calls import ranks_phrase
from distdoctor.models.record import is_peer_echo

WIDTH = 100


def wrap(text: str, indent: str = "", first: str | None = None) -> str:
    return textwrap.fill(text, WIDTH, initial_indent=indent if first is None else first,
                         subsequent_indent=indent + "  ")


def ranks_line(record: RunRecord) -> str:
    """How the ranks ended, root cause first: 'all 4 finished' or who failed how."""
    ends = [r.end for r in record.ranks]
    if all(e.ok for e in ends):
        return f"all {len(ends)} ranks finished"
    groups: dict[str, list[int]] = {}
    for end in sorted(ends, key=lambda e: (e.ok, is_peer_echo(e), e.at or 0.0)):
        if end.ok:
            text = "finished"
        elif is_peer_echo(end):
            text = f"{end.status} (echo: a peer went away)"
        else:
            text = f"{end.status}: {end.headline[:160]}"
        groups.setdefault(text, []).append(end.rank)
    return "; ".join(f"{ranks_phrase(r)} {text}" for text, r in groups.items())
