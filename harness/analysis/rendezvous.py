"""torchrun's rendezvous of nodes, judged: nodes that can never meet.

Before any rank exists, torchrun's agents meet as nodes (``--nnodes``, ``--rdzv-id``,
``--rdzv-endpoint``). What each agent waits for is known from its own note (under
``run -- COMMAND``: inrank/rendezvous_note.py) or its command line (``attach``:
attaching/agents.py). Agents at one endpoint asking for different ``--rdzv-id`` (where
one asks for more nodes than its id has there) or ``--nnodes`` never complete one
round: proven as soon as both are known. An agent alone
is judged at the start-up deadline, or when its own join timeout ends it: what it
waited for and who came.
"""

from __future__ import annotations

from dataclasses import dataclass

from distdoctor.models import CauseKind

SAME_EVERYWHERE = ("start every node's torchrun with the same --nnodes, --rdzv-id and "
                   "--rdzv-endpoint (or --master-addr and --master-port)")


@dataclass(frozen=True)
class AgentNote:
    """One torchrun agent inside its rendezvous (or whose rendezvous raised)."""

    pid: int
    host: str
    since: float
    run_id: str | None
    min_nodes: int | None
    max_nodes: int | None
    endpoint: str | None
    joined: tuple[str, ...] | None  # the nodes it saw join; None: it keeps no view
    raised: str | None
    returned: bool = False  # its rendezvous completed (compared with nodes still waiting)

    @property
    def name(self) -> str:
        return f"the node on {self.host} (agent pid {self.pid})"

    @property
    def nnodes(self) -> str:
        return f"{self.min_nodes}" if self.min_nodes == self.max_nodes else \
            f"{self.min_nodes}:{self.max_nodes}"


@dataclass(frozen=True)
class Unformed:
    """Nodes whose rendezvous never completes: the cause's kind, what shows it, the fix,
    and whether it is proven (else the deadline, or the agent's own timeout, decided)."""

    kind: CauseKind
    summary: str
    fix: str
    proven: bool


def judge(notes: list[AgentNote], now: float, limit: float,
          ended: bool = False) -> Unformed | None:
    """Nodes at one endpoint that disagree (proven), an agent still waiting after
    ``limit`` seconds, or (``ended``) one whose own join timeout ended it."""
    mismatch = _disagree(notes)
    if mismatch is not None:
        return mismatch
    waiting = [n for n in notes if n.raised is None and not n.returned and not ended]
    late = [n for n in waiting if now - n.since >= limit]
    gave_up = [n for n in notes if n.raised is not None and ended]  # (its launcher ends)
    if not late and not gave_up:
        return None
    note = (late or gave_up)[0]
    how = f"has waited {now - note.since:.0f} s" if note in late else \
        f"gave up ({(note.raised or '').rstrip(': ')})"
    came = "not known (a static rendezvous)" if note.joined is None else \
        ", ".join(note.joined) if note.joined else "none"
    return Unformed(
        "rendezvous-incomplete",
        f"torchrun's rendezvous{_named(note)} at {note.endpoint or 'its endpoint'} never "
        f"completed: {note.name} waits for {note.min_nodes} node"
        f"{'s' * (note.min_nodes != 1)} (--nnodes {note.nnodes}) and {how}; nodes joined: "
        f"{came}. The other nodes were never started, or were started with another "
        f"--rdzv-id, --rdzv-endpoint or --nnodes",
        f"{SAME_EVERYWHERE}, and check that every node's launcher started", proven=False)


def _disagree(notes: list[AgentNote]) -> Unformed | None:
    by_endpoint: dict[str, list[AgentNote]] = {}
    for note in notes:
        if note.endpoint is not None:
            by_endpoint.setdefault(_port(note.endpoint), []).append(note)
    for same in by_endpoint.values():
        if len({n.run_id for n in same}) > 1 and _short(same):
            said = "; ".join(f"{n.name}: --rdzv-id {n.run_id}" for n in same)
            return Unformed(
                "rendezvous-mismatch",
                f"torchrun's agents at {same[0].endpoint} wait in different rendezvous, each "
                f"for nodes that never join it: {said}", SAME_EVERYWHERE, proven=True)
        if len({(n.min_nodes, n.max_nodes) for n in same}) > 1:
            said = "; ".join(f"{n.name}: --nnodes {n.nnodes}" for n in same)
            return Unformed(
                "rendezvous-mismatch",
                f"torchrun's agents{_named(same[0])} at {same[0].endpoint} wait for "
                f"different numbers of nodes, so they never all meet: {said}",
                SAME_EVERYWHERE, proven=True)
    return None


def _short(same: list[AgentNote]) -> bool:
    """Does some agent wait for more nodes than its own rendezvous (its --rdzv-id) has at
    this endpoint? Rendezvous that each hold the nodes they ask for (two one-node jobs
    sharing an endpoint) complete apart: other ids there prove nothing."""
    ids: dict[str | None, int] = {}
    for note in same:
        ids[note.run_id] = ids.get(note.run_id, 0) + 1
    return any(not n.returned and (n.min_nodes is None or ids[n.run_id] < n.min_nodes)
               for n in same)


def _named(note: AgentNote) -> str:
    """" 'job-7'" for a rendezvous with an id of its own (static ones are all "none")."""
    return f" '{note.run_id}'" if note.run_id and note.run_id != "none" else ""


def _port(endpoint: str) -> str:
    """What two spellings of one endpoint share ("localhost:29400", "127.0.0.1:29400")."""
    return endpoint.rpartition(":")[2]


def agent_of(event: object) -> AgentNote | None:
    """A note as read (a file in a folder others can write: every field checked)."""
    if not isinstance(event, dict):
        return None
    pid, since = event.get("pid"), event.get("t")
    if not isinstance(pid, int) or not isinstance(since, (int, float)):
        return None
    joined = event.get("joined")
    return AgentNote(
        pid, _text(event.get("host")) or "?", float(since), _text(event.get("run_id")),
        _count(event.get("min_nodes")), _count(event.get("max_nodes")),
        _text(event.get("endpoint")),
        tuple(j for j in joined if isinstance(j, str)) if isinstance(joined, list) else None,
        _text(event.get("raised")), event.get("returned") is True)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
