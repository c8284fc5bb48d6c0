"""Reading the traces ranks wrote under torchrun (``--trace-dir``), whatever state they are in.

``distdoctor analyze`` exists for runs that went wrong: a rank OOM-killed mid-line, a node
that vanished before it wrote, a folder shared by two runs. So a line that cannot be read
(cut short, not JSON, fields of the wrong type) is skipped and named once per file; a rank
with no trace is named, and counted as a rank that ended, so peers waiting for it point at
it; and traces of different runs (each trace opens with its run id and world size) are
never mixed: the caller names the run, or is told which runs there are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from distdoctor.analysis.waitfor import PROVEN
from distdoctor.dumps.files import DUMP_PREFIX
from distdoctor.models import RankEnd, Seen
from distdoctor.models.calls import first_few
from distdoctor.models.events import Ev
from distdoctor.models.jsoncodec import SchemaError, from_json
from distdoctor.models.record import FATAL, is_peer_echo
from distdoctor.trace.stalls import last_stall, still_stalled, stopped_raising

SHOWN_LINES = 8  # unreadable lines named in the note; the rest counted
NO_TRACE = "no trace: its node may have died before it wrote"
KILLED = ("its trace stops mid-run with no exit, no stall and no stacks: it was killed "
          "(SIGKILL, the OOM killer) or its node died")


class TraceError(ValueError):
    """The traces cannot be analysed as one job (no traces, or several runs mixed)."""


@dataclass(frozen=True)
class RankTrace:
    rank: int
    path: Path
    events: tuple[dict, ...]  # the readable lines, in order
    unreadable: tuple[int, ...]  # line numbers skipped
    run: str | None  # from the opening line, when it survived
    world: int | None


@dataclass(frozen=True)
class Job:
    ends: tuple[RankEnd, ...]
    events: tuple[tuple[dict, ...], ...]
    notes: tuple[str, ...]  # what could not be read, one line each

    @property
    def partial(self) -> bool:
        return bool(self.notes)


def read(path: Path, rank: int) -> RankTrace:
    """Every line of ``path`` that parses and folds into evidence; the others' numbers."""
    from distdoctor.trace.evidence import evidence_from_events

    events, unreadable = [], []
    raw = path.read_bytes()
    for number, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line.decode())
            if not isinstance(event, dict):
                raise ValueError("not an object")
            evidence_from_events(rank, (), (event,))  # the fields it needs, of their types
        except Exception:  # noqa: BLE001 (counted as an unreadable line and named in the report)
            unreadable.append(number)
            continue
        events.append(event)
    events = _foldable(rank, events, unreadable)
    start = next((e for e in events if e.get("ev") == Ev.START), {})
    run, world = start.get("run"), start.get("world")
    return RankTrace(rank, path, tuple(events), tuple(sorted(unreadable)),
                     run if isinstance(run, str) else None,
                     world if isinstance(world, int) and world > 0 else None)


def _foldable(rank: int, events: list[dict], unreadable: list[int]) -> list[dict]:
    """Lines that read alone can still clash together: keep, in order, each line that
    leaves the whole foldable (rarely needed, so its cost does not matter)."""
    from distdoctor.trace.evidence import evidence_from_events

    try:
        evidence_from_events(rank, (), tuple(events))
        return events
    # Folded again event by event below, which names what it drops.
    except Exception:  # noqa: BLE001, S110
        pass
    kept: list[dict] = []
    for event in events:
        try:
            evidence_from_events(rank, (), tuple(kept + [event]))
            kept.append(event)
        except Exception:  # noqa: BLE001 (counted as unreadable and named in the report)
            unreadable.append(-1)  # its own line number is unknown by now
    return kept


def has_traces(directory: str) -> bool:
    """Does ``directory`` hold a rank's trace (rank-N.jsonl)?"""
    return any(p.stem.split("-", 1)[1].isdigit() for p in Path(directory).glob("rank-*.jsonl"))


def load(directories: list[str], run: str | None = None) -> Job:
    """The job the traces in ``directories`` hold: one end and one event list per rank."""
    from distdoctor.launch.stacks import parse_faulthandler

    found: dict[int, Path] = {}
    for directory in directories:
        paths = [p for p in Path(directory).glob("rank-*.jsonl")
                 if p.stem.split("-", 1)[1].isdigit()]
        if not paths:
            raise TraceError(f"no rank-*.jsonl traces in {directory}")
        for path in paths:
            rank = int(path.stem.split("-", 1)[1])
            if rank in found:
                raise TraceError(f"{found[rank]} and {path} are both rank-{rank}: these "
                                 f"directories are not one job's")
            found[rank] = path
    traces = [read(path, rank) for rank, path in sorted(found.items())]
    traces = _one_run(traces, run)
    world = max([t.world for t in traces if t.world] + [t.rank + 1 for t in traces])
    by_rank = {t.rank: t for t in traces}
    notes = [f"{t.path}: {'lines' if len(t.unreadable) > 1 else 'line'} "
             f"{_lines(t.unreadable)} could not be read, skipped"
             for t in traces if t.unreadable]
    # a hung rank stopped when it dumped its stacks: at its own stall, or, poked by a
    # peer's watch (its own could not run), at the latest stall (the machine's clock,
    # as the calls' times; analyze's job starts at 0)
    latest_stall = max((e["t"] for trace in traces for e in trace.events
                        if e.get("ev") == Ev.STALLED and isinstance(e.get("t"), (int, float))),
                       default=None)
    ends: list[RankEnd] = []
    events: list[tuple[dict, ...]] = []
    for rank in range(world):
        trace = by_rank.get(rank)
        if trace is None:
            notes.append(f"rank {rank}: {NO_TRACE}")
            ends.append(RankEnd(rank, "died", at=0.0, error=NO_TRACE))
            events.append(())
            continue
        exit_event = next((e for e in reversed(trace.events) if e.get("ev") == Ev.EXIT), None)
        stack_file = trace.path.with_suffix(".stacks")
        raw = _latest_stacks(stack_file.read_text(errors="replace")
                             if stack_file.exists() else "")
        stalled = still_stalled(trace.events)
        if FATAL in raw:  # the fatal signal's dump is the last word (after any stall's)
            raw = raw[raw.rindex(FATAL):]
        raising = stopped_raising(trace.events) if exit_event is None else None
        if raising is not None and FATAL not in raw:
            # its call failed and it was stopped (torchrun's SIGTERM) before it said so
            ends.append(RankEnd(rank, "raised", at=0.0, error=raising))
        elif exit_event is None and not stalled and not raw.strip():
            # a hung rank notes its stall and, stopped, dumps its stacks: this one went
            # with neither, as a SIGKILL, the OOM killer or a lost node takes a process
            ends.append(RankEnd(rank, "died", at=0.0, error=KILLED))
        elif exit_event is None and FATAL in raw and not stalled:
            # faulthandler's dump of a fatal signal: "Fatal Python error: Aborted"
            fatal = next(line for line in raw.splitlines() if FATAL in line)
            ends.append(RankEnd(rank, "died", at=0.0,
                                error=f"{fatal.strip()} (its Python stacks in "
                                      f"{stack_file.name}; the message before it went to "
                                      f"the launcher's stderr)",
                                exitcode=-6 if "Aborted" in fatal else None, stderr=raw,
                                stacks=parse_faulthandler(raw, _thread_names(trace.events)),
                                raw_stack=raw))
        elif exit_event is None:
            # what the rank wrote at a stall it later moved past is stale: its samples and
            # Flight Recorder history tell where it waited then, not where it was stopped
            stall = last_stall(trace.events) if stalled else {}
            proof, own = stall.get("proof"), stall.get("t")
            ends.append(RankEnd(rank, "hung", at=own if isinstance(own, (int, float))
                                else latest_stall, error=f"{PROVEN}: {proof}"
                                if isinstance(proof, str) else
                                "its trace stops without an exit",
                                stacks=parse_faulthandler(raw, _thread_names(trace.events)),
                                raw_stack=raw or None,
                                recorded=_flight(trace.path.with_name(
                                    f"{DUMP_PREFIX}{rank}")) if stalled else (),
                                seen=_seen(trace.events) if stalled else ()))
        elif exit_event.get("status") == "raised":
            error = exit_event.get("error")
            ends.append(RankEnd(rank, "raised", at=0.0,
                                error=error if isinstance(error, str) else "raised"))
        elif exit_event.get("status") == "exited":  # sys.exit(N) or os._exit(N), N != 0
            code = exit_event.get("code")
            ends.append(RankEnd(rank, "died", at=0.0, error=f"exited with code {code}",
                                exitcode=code if isinstance(code, int) else None))
        else:
            ends.append(RankEnd(rank, "finished"))
        events.append(trace.events)
    if any(end.status == "hung" for end in ends):
        for rank, end in enumerate(ends):
            if is_peer_echo(end):
                ends[rank], events[rank] = _still_waiting(end, events[rank])
    return Job(tuple(ends), tuple(events), tuple(notes))


def _latest_stacks(raw: str) -> str:
    """What follows the last mark the rank's watch wrote (before each stall's dump, and
    when it moved past one): the dumps before it show where the rank waited then."""
    from distdoctor.launch.stacks import MARK

    lines = raw.splitlines(keepends=True)
    marks = [i for i, line in enumerate(lines) if line.startswith(MARK)]
    return "".join(lines[marks[-1] + 1:]) if marks else raw


def _flight(path: Path) -> tuple:
    """The Flight Recorder dump a stalled rank wrote beside its trace (bootstrap.py), as
    Recorded collectives; none when it wrote none or it cannot be read as plain data."""
    from distdoctor.dumps.live import history_of, recorded
    from distdoctor.dumps.read import load

    try:
        return recorded(history_of(load(path)))
    except (OSError, ValueError):  # missing, cut short, or not plain data (NotPlainData)
        return ()


def _still_waiting(end: RankEnd, events: tuple[dict, ...]) -> tuple[RankEnd, tuple[dict, ...]]:
    """A rank whose call failed only because a stalled peer went away (it exited with
    --exit-on-hang, or torchrun stopped it) was waiting in that call like the others:
    as evidence, its last call is still open and the rank was stopped in it."""
    failed = next((e for e in reversed(events) if e.get("ev") == Ev.ERROR), None)
    kept = tuple(e for e in events if e is not failed)
    return RankEnd(end.rank, "stopped", at=end.at,
                   error=f"its call failed only once a stalled peer was gone: {end.headline}"
                   ), kept


def _seen(events: tuple[dict, ...]) -> tuple[Seen, ...]:
    """The lines a stalled rank's main thread was seen at (its last stall's samples), read
    through the JSON codec as bootstrap.py wrote them; anything that does not fit is left
    out, as none (a trace is read, never trusted)."""
    stalls = [e for e in events if e.get("ev") == Ev.STALLED]
    try:
        return from_json(tuple[Seen, ...], stalls[-1].get("seen", [])) if stalls else ()
    except SchemaError:
        return ()


def _thread_names(events: tuple[dict, ...]) -> dict[str, str]:
    """The names each rank wrote for its threads' ids (at its start and its stall)."""
    names: dict[str, str] = {}
    for event in events:
        threads = event.get("threads") if event.get("ev") in (Ev.START, Ev.STALLED) else None
        if isinstance(threads, dict):
            names.update({k: v for k, v in threads.items()
                          if isinstance(k, str) and isinstance(v, str)})
    return names


def _one_run(traces: list[RankTrace], run: str | None) -> list[RankTrace]:
    runs: dict[str | None, list[RankTrace]] = {}
    for trace in traces:
        runs.setdefault(trace.run, []).append(trace)
    if run is not None:
        if run not in runs:
            raise TraceError(f"no trace of run {run!r}; the traces are of "
                             f"{_listing(runs)}")
        return runs[run]
    named = [r for r in runs if r is not None]
    if len(named) > 1:
        raise TraceError(f"these traces are of {len(named)} runs, not one: "
                         f"{_listing(runs)}; pick one with --run ID")
    return traces


def _listing(runs: dict) -> str:
    return "; ".join(f"run {r or 'unknown'}: " + ", ".join(t.path.name for t in ts)
                     for r, ts in runs.items())


def _lines(numbers: tuple[int, ...]) -> str:
    known = [str(n) for n in numbers if n > 0]
    extra = len(numbers) - len(known)
    return first_few(known, SHOWN_LINES) + (
        f"{' and ' if known else ''}{extra} that clashed with others" if extra else "")
