"""torchrun's agents under ``distdoctor run -- COMMAND``: their notes, read.

Each agent notes what its ``next_rendezvous`` waits for (inrank/rendezvous_note.py) in
``RENDEZVOUS`` under the command's trace folder; the watcher reads them here and judges
them with analysis/rendezvous.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from distdoctor.analysis.rendezvous import AgentNote, agent_of

RENDEZVOUS = "rendezvous"  # the agents' notes' folder, under the command's trace folder


def agents(traces: Path, members: Callable[[], list[int]],
           ended: bool = False) -> list[AgentNote]:
    """The command's agents in, or past, their rendezvous (the living ones), and those
    whose rendezvous raised; ``ended``: the command has ended, every note left is read."""
    notes = sorted((traces / RENDEZVOUS).glob("*.json"))
    if not notes:
        return []
    alive, found = set(members()) if not ended else set(), []
    for path in notes:
        try:
            event = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # removed as we read it: the rendezvous completed
        note = agent_of(event)
        if note is not None and (ended or note.pid in alive or note.raised is not None):
            found.append(note)
    return found
