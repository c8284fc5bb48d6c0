"""Why a group never formed: the ranks' start-ups, judged together.

``init_process_group`` returns on no rank until every rank of the group has joined one
rendezvous. What each rank gave it and what its launcher set (trace/startup.py) proves,
while the ranks still wait, the groups that can never form:

* a world size that is not the number of ranks the launchers started (a cluster
  config's ``world_size=4`` under ``--nproc-per-node 2``: ranks 2 and 3 never come);
* two processes claiming one rank (``LOCAL_RANK`` passed as the rank on two nodes);
* ranks pointed at different rendezvous (another ``MASTER_PORT`` on one node);
* ranks asking for different backends (each picks its own from what it sees: gloo where
  no GPU is visible, nccl elsewhere), which never form one group whether they wait in the
  call (gloo's rendezvous) or past it (nccl connects at the first collective), so it is
  judged on every rank that entered the call, returned or not.

Read live by the wait-for graph (analysis/waitfor.py), so the hang is named as soon as
every rank waits, and after the fact by checks/startup.py from the same records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from distdoctor.models import CauseKind, Startup
from distdoctor.models.calls import grouped, ranks_phrase, relative_line

ENV_RENDEZVOUS = "env://"


@dataclass(frozen=True)
class NeverForms:
    """A group that can never form: the cause's kind (a CauseKind), the ranks to blame,
    what shows it, the fix, and the lines to look at."""

    kind: CauseKind
    ranks: tuple[int, ...]
    headline: str  # the key fact in a few words, for tables
    symptom: str
    fix: str
    where: tuple[str, ...]


def startup_of(event: Mapping[str, Any], joined: bool = False) -> Startup:
    """An Ev.INIT trace event as a Startup, every field checked (a trace is read, never
    trusted): a field of the wrong type reads as not given."""
    env = event.get("env")
    env = env if isinstance(env, dict) else {}
    t = event.get("t")
    return Startup(
        where=_text(event.get("where")) or "", backend=_text(event.get("backend")),
        init_method=_text(event.get("init_method")), rank=_number(event.get("rank")),
        world_size=_number(event.get("world_size")),
        env=tuple(sorted((k, v) for k, v in env.items()
                         if isinstance(k, str) and isinstance(v, str))),
        store_given=event.get("store") is True, joined=joined,
        t=float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else 0.0)


def expected_world(startup: Startup) -> int | None:
    """The group size the rank waits for: its ``world_size``, else its launcher's."""
    return startup.world_size if startup.world_size is not None else \
        _integer(startup.variable("WORLD_SIZE"))


def claimed_rank(startup: Startup) -> int | None:
    """The rank it asks for: its ``rank``, else its launcher's RANK."""
    return startup.rank if startup.rank is not None else _integer(startup.variable("RANK"))


def launcher_numbering(startup: Startup) -> tuple[int | None, int | None]:
    """(RANK, WORLD_SIZE) as the rank's launcher set them, whatever it passed."""
    return _integer(startup.variable("RANK")), _integer(startup.variable("WORLD_SIZE"))


def rendezvous(startup: Startup) -> str | None:
    """Where it meets its peers: its init_method, or for ``env://`` (the default) its
    MASTER_ADDR:MASTER_PORT; None for a store object passed in (not ours to read)."""
    if startup.store_given:
        return None
    if startup.init_method and startup.init_method != ENV_RENDEZVOUS:
        return startup.init_method
    address, port = startup.variable("MASTER_ADDR"), startup.variable("MASTER_PORT")
    return f"{address}:{port}" if address and port else None


def never_forms(waiting: Mapping[int, Startup], started: int) -> NeverForms | None:
    """The cause, if the ranks inside ``init_process_group`` (by the launchers' rank
    numbering: ``waiting``) prove their group can never form; ``started``: how many ranks
    the launchers started in all (the job's world)."""
    return _world_size(waiting, started) or _one_rank_twice(waiting) or \
        _split_rendezvous(waiting) or backends_differ(waiting)


def backends(startup: Startup) -> frozenset[str] | None:
    """The backends a rank asked for by name (``"cpu:gloo,cuda:nccl"`` asks for two);
    None where it passed none (torch's default, the same on every rank)."""
    if startup.backend is None or startup.backend.strip().lower() in ("", "undefined"):
        return None
    return frozenset(part.rpartition(":")[2].strip().lower()
                     for part in startup.backend.split(",") if part.strip())


def backends_differ(entered: Mapping[int, Startup]) -> NeverForms | None:
    """Ranks that entered init_process_group asking for different backends by name: every
    rank of a group makes it with one backend. Ranks that named none are not judged."""
    asked = {rank: names for rank, s in entered.items()
             if (names := backends(s)) is not None}
    kinds = set(asked.values())
    if len(kinds) < 2:
        return None
    said = {rank: ", ".join(sorted(names)) for rank, names in asked.items()}
    counts = {names: sum(1 for n in asked.values() if n == names) for names in kinds}
    odd = min(kinds, key=lambda names: (counts[names], sorted(names)))
    blamed = tuple(sorted(r for r, names in asked.items() if names == odd)) \
        if counts[odd] * 2 < len(asked) else tuple(sorted(asked))
    return NeverForms(
        "backend-mismatch", blamed,
        f"{len(kinds)} backends for one group",
        "the ranks ask init_process_group for different backends, so they never form one "
        "group: " + "; ".join(grouped(said)),
        "choose the backend once for the whole job, the same on every rank (the launch "
        "command's or the config's, never what each rank sees of its own machine), or pass "
        "none: init_process_group then makes gloo for CPU tensors and nccl for CUDA ones on "
        "every rank", _lines([entered[r] for r in sorted(asked)]))


def _world_size(waiting: Mapping[int, Startup], started: int) -> NeverForms | None:
    expects = {rank: expected_world(s) for rank, s in waiting.items()}
    over = {rank: w for rank, w in expects.items() if w is not None and w > started}
    if not over:
        return None
    world = max(over.values())
    passed = [waiting[r] for r in over if waiting[r].world_size is not None]
    how = f"world_size={world} at {relative_line(passed[0].where)}" if passed else \
        f"WORLD_SIZE={world} in its environment"
    absent = list(range(started, world))
    launcher = any(s.variable("WORLD_SIZE") == str(started) for s in waiting.values())
    counted = f"WORLD_SIZE={started} as the launcher set it" if launcher else \
        "no launcher's WORLD_SIZE: the processes that entered the call"
    return NeverForms(
        "world-size-mismatch", tuple(sorted(over)),
        f"a group of {world}, {started} rank{'s' * (started != 1)} started",
        f"{ranks_phrase(over)} wait{'s' * (len(over) == 1)} in init_process_group for a "
        f"group of {world} ({how}), but {started} rank{'s' * (started != 1)} "
        f"{'were' if started != 1 else 'was'} started ({counted}): "
        f"{ranks_phrase(absent)} never come{'s' * (len(absent) == 1)}",
        'take the group\'s size from the launcher: world_size=int(os.environ["WORLD_SIZE"])'
        ' (or pass neither rank nor world_size: init_process_group reads them from the '
        'environment)', _lines(passed))


def _one_rank_twice(waiting: Mapping[int, Startup]) -> NeverForms | None:
    claims: dict[int, list[int]] = {}
    for rank, startup in sorted(waiting.items()):
        claimed = claimed_rank(startup)
        if claimed is not None:
            claims.setdefault(claimed, []).append(rank)
    twice = {claimed: ranks for claimed, ranks in claims.items() if len(ranks) > 1}
    if not twice:
        return None
    blamed = sorted(r for ranks in twice.values() for r in ranks)
    said = "; ".join(f"{ranks_phrase(ranks)} {'both' if len(ranks) == 2 else 'all'} ask "
                     f"for rank {claimed}"
                     for claimed, ranks in twice.items())
    passed = [waiting[r] for r in blamed if waiting[r].rank is not None]
    how = f" (rank={passed[0].rank} at {relative_line(passed[0].where)}" \
        f"{_as_set(waiting, blamed)})" if passed else ""
    return NeverForms(
        "duplicate-rank", tuple(blamed),
        f"rank{'s' * (len(twice) > 1)} {', '.join(map(str, twice))} asked for twice",
        f"{said}{how}: a rank is taken once, so the group never fills",
        'pass the global rank the launcher set: rank=int(os.environ["RANK"]), not '
        "LOCAL_RANK (the processes of one node, for the device) nor another launcher's "
        "variable", _lines([waiting[r] for r in blamed]))


def _as_set(waiting: Mapping[int, Startup], ranks: list[int]) -> str:
    """', while the launchers set RANK=0, 1' (and LOCAL_RANK where it is what was passed)."""
    ranks_set = [waiting[r].variable("RANK") for r in ranks]
    if any(v is None for v in ranks_set):
        return ""
    said = f", while the launcher{'s' * (len(set(ranks_set)) > 1)} set RANK=" \
        + ", ".join(v for v in ranks_set if v is not None)
    local = [waiting[r].variable("LOCAL_RANK") for r in ranks]
    if all(waiting[r].rank is not None and str(waiting[r].rank) == local[i]
           for i, r in enumerate(ranks)):
        said += " and passed LOCAL_RANK, the rank within each node"
    return said


def _split_rendezvous(waiting: Mapping[int, Startup]) -> NeverForms | None:
    """Ranks at different ports (or files) meet at different stores. Hosts are not
    compared: "localhost" and "127.0.0.1" are one store, and a name's address is not ours
    to look up."""
    places = {rank: rendezvous(s) for rank, s in waiting.items()}
    known = {rank: place for rank, place in places.items() if place is not None}
    if len({_store_key(place) for place in known.values()}) < 2:
        return None
    return NeverForms(
        "split-rendezvous", tuple(sorted(known)),
        f"{len({_store_key(p) for p in known.values()})} rendezvous for one group",
        "the ranks wait at different rendezvous, each for a group that never fills: "
        + "; ".join(grouped({r: f"at {place}" for r, place in known.items()}, " ")),
        "give every rank one rendezvous: the same MASTER_ADDR and MASTER_PORT (torchrun: "
        "the same --rdzv-endpoint or --master-addr/--master-port on every node)",
        _lines([waiting[r] for r in sorted(known)]))


def _store_key(place: str) -> str:
    """What two spellings of one rendezvous share: a file's path, else the port."""
    if place.startswith("file://"):
        return place
    return place.rpartition(":")[2].rstrip("/")


def _lines(startups: list[Startup]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(relative_line(s.where) for s in startups if s.where))


def _integer(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
