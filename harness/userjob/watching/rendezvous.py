"""torchrun's agents under ``distdoctor run -- COMMAND``: their notes, read.

Each agent notes what its ``next_rendezvous`` waits for (inrank/rendezvous_note.py) in
``RENDEZVOUS`` under the command's trace folder; the watcher reads them here and judges
them with analysis/rendezvous.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from distdoctor.analysis.rendezvous import AgentNote, agent_of
from distdoctor.userjob.watching.notes import live_notes

RENDEZVOUS = "rendezvous"  # the agents' notes' folder, under the command's trace folder


def agents(traces: Path, members: Callable[[], list[int]],
           ended: bool = False) -> list[AgentNote]:
    """The command's agents in, or past, their rendezvous (the living ones), and those
    whose rendezvous raised; ``ended``: the command has ended, every note left is read."""
    return [note for note in map(agent_of, live_notes(traces / RENDEZVOUS, members, ended))
            if note is not None]
