"""The notes processes of ``run -- COMMAND`` leave in a folder while they wait (ranks in
``init_process_group``: joining.py; torchrun's agents in their rendezvous: rendezvous.py),
read by one rule: a note counts while its process lives, or once it says the call raised
(the process may be gone), or, when the command has ended, whatever is left."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable


def live_notes(folder: Path, members: Callable[[], list[int]],
               ended: bool = False) -> list[dict]:
    """The notes in ``folder`` that count (``members``: the command's processes, asked
    only when some note exists), each a dict with an int ``pid``; files removed or half
    written as they are read are skipped (the call returned)."""
    paths = sorted(folder.glob("*.json"))
    if not paths:
        return []
    alive, found = set(members()) if not ended else set(), []
    for path in paths:
        try:
            event = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(event, dict) or not isinstance(event.get("pid"), int):
            continue
        if ended or event["pid"] in alive or isinstance(event.get("raised"), str):
            found.append(event)
    return found
