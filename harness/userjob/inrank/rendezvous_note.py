"""Inside torchrun's agent under ``distdoctor run -- COMMAND``: what the agent's own
rendezvous waits for, written where the watcher reads it.

Before any rank exists, torchrun's agents meet in a rendezvous of nodes (``--nnodes``,
``--rdzv-id``, ``--rdzv-endpoint``). Nodes started with another ``--rdzv-id`` or
``--nnodes``, or a node never started, leave every agent waiting for its join timeout
(600 s by default), with no rank and so no trace. While ``next_rendezvous`` runs, the
agent's note says what it asked for and which nodes it has seen join (its own synced
view of the rendezvous, read in-process: nothing is read from or written to the store).
The note is removed when the call returns and marked when it raises.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

REFRESH_S = 0.5  # how often a waiting agent's note says who has joined


class RendezvousNote:
    """One agent's note while its ``next_rendezvous`` runs."""

    def __init__(self, folder: Path, handler: Any) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{socket.gethostname()}-{os.getpid()}.json"
        self.handler = handler
        self.static = getattr(handler, "get_backend", lambda: None)() == "static"
        self.event = {"pid": os.getpid(), "host": socket.gethostname(), "t": time.monotonic(),
                      **(_static_asked(handler) if self.static else _dynamic_asked(handler)),
                      "joined": None if self.static else []}
        self.done = threading.Event()
        self._write()
        if not self.static:  # a static rendezvous keeps no view of who came
            threading.Thread(target=self._refresh, name="distdoctor-rendezvous-note",
                             daemon=True).start()

    def end(self, raised: BaseException | None) -> None:
        """The call returned or raised: the note says which, and stays while the agent
        lives (a node that went on is compared with one still waiting at its endpoint)."""
        self.done.set()
        if raised is None:
            self.event["returned"] = True
        else:
            self.event["raised"] = f"{type(raised).__name__}: {raised}".rstrip(": ")
        self._write()

    def _refresh(self) -> None:
        while not self.done.wait(REFRESH_S):
            joined = _joined(self.handler)
            if joined != self.event["joined"] and not self.done.is_set():
                self.event["joined"] = joined
                self._write()

    def _write(self) -> None:
        written = self.path.with_suffix(".part")
        written.write_text(json.dumps(self.event))
        os.replace(written, self.path)  # read whole or not at all


def _dynamic_asked(handler: Any) -> dict:
    """What a dynamic rendezvous (``--rdzv-backend c10d``, ``--standalone``) waits for."""
    settings = getattr(handler, "settings", None)
    return {"run_id": _text(getattr(settings, "run_id", None)),
            "min_nodes": _count(getattr(settings, "min_nodes", None)),
            "max_nodes": _count(getattr(settings, "max_nodes", None)),
            "endpoint": _endpoint(handler)}


def _static_asked(handler: Any) -> dict:
    """What a static rendezvous (``--master-addr``/``--master-port``) waits for: every
    node of ``--nnodes`` connected to node 0's store."""
    world = _count(getattr(handler, "world_size", None))
    address, port = getattr(handler, "master_addr", None), getattr(handler, "master_port", None)
    return {"run_id": _text(getattr(handler, "run_id", None)), "min_nodes": world,
            "max_nodes": world, "node_rank": _count(getattr(handler, "rank", None)),
            "endpoint": f"{address}:{port}" if address is not None and port is not None
            else None}


def _joined(handler: Any) -> list[str]:
    """The nodes in the agent's synced view of the round (host names), read-only."""
    try:
        participants = handler._state_holder.state.participants
        return sorted(str(getattr(node, "addr", node)) for node in list(participants))
    except Exception:  # noqa: BLE001 (torch's internals moved: the note says no nodes)
        return []


def _endpoint(handler: Any) -> str | None:
    """host:port of the rendezvous store (c10d backend), where torch keeps it."""
    try:
        store = handler._state_holder._backend._store
        return f"{store.host}:{store.port}"
    except Exception:  # noqa: BLE001 (another backend, or torch's internals moved: unknown)
        return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
