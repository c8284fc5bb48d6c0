"""``distdoctor run -- COMMAND``: any launcher's job, its ranks traced and watched from here.

The command runs as is, its output and exit code its own; the processes of it that become
ranks trace themselves (autohook.py) into one directory per process group. This process
watches those directories as the torchrun path's watching rank does, from outside: it
proves deadlocks from the traces (dirwatch.py's wait-for graph; the ranks see the proof
and write their stacks), and once a group's ranks have all stalled or ended it asks the
ones still silent (busy holding the GIL) for their stacks, stops the command's whole tree
and hands the directories to the same reader ``analyze`` uses.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from distdoctor.analysis.rendezvous import Unformed
from distdoctor.analysis.rendezvous import judge as judge_rendezvous
from distdoctor.launch import tree
from distdoctor.models import deadlines
from distdoctor.models.events import Ev
from distdoctor.userjob.inrank import autohook
from distdoctor.userjob.watching import dirwatch, joining, rendezvous

POLL_S = 0.05
STACKS_WAIT_S = 5.0  # for a stalled or poked rank's stacks to reach its file


class CommandStartError(RuntimeError):
    """The command could not be started (not found, not executable)."""


@dataclass(frozen=True)
class CommandResult:
    code: int | None  # the command's own exit code; None when distdoctor stopped it
    groups: tuple[Path, ...]  # one trace directory per process group, in order of start
    stopped_hung: Path | None  # the group whose hang made distdoctor stop the command
    wall_s: float
    root: Path  # holds hook/ and traces/; the caller removes it
    # torchrun's own rendezvous of nodes that never completed (no rank was started)
    unformed: Unformed | None = None


@dataclass
class _Rank:
    pid: int | None = None
    offset: int = 0
    tail: bytes = b""
    stalled: bool = False
    ended: bool = False
    poked_at: float | None = None


@dataclass
class _Group:
    """One process group's directory as its ranks write it."""

    directory: Path
    world: int = 0
    ranks: dict[int, _Rank] = field(default_factory=dict)
    watch: dirwatch.TraceDirectory | None = None
    first_stall: float | None = None
    last_growth: float = field(default_factory=time.monotonic)  # any rank's trace grew
    stall_called: bool = False
    called: bool = False  # some rank has entered a collective or send/receive

    def read(self) -> None:
        for path in self.directory.glob("rank-*.jsonl"):
            number = path.stem.split("-", 1)[1]
            if not number.isdigit():
                continue
            rank = self.ranks.setdefault(int(number), _Rank())
            try:
                with open(path, "rb") as trace:
                    trace.seek(rank.offset)
                    chunk = trace.read()
            except OSError:
                continue
            rank.offset += len(chunk)
            if chunk:
                self.last_growth = time.monotonic()
            lines = (rank.tail + chunk).split(b"\n")
            rank.tail = lines.pop()
            for line in lines:
                if b'"ev":"' + Ev.START.encode() + b'"' in line and rank.pid is None:
                    start = json.loads(line)
                    rank.pid, self.world = start.get("pid"), int(start.get("world") or 0)
                elif b'"ev":"' + Ev.STALLED.encode() + b'"' in line:
                    rank.stalled = True
                elif b'"ev":"' + Ev.EXIT.encode() + b'"' in line:
                    rank.ended = True
                elif line.startswith(b'{"ev":"' + Ev.ENTER.encode() + b'"'):
                    self.called = True

    def hung(self, now: float, deadline: float) -> bool:
        """Has every rank of this group stalled, ended, or been asked for its stacks
        after a peer stalled, with the stacks written? Proves deadlocks meanwhile, and
        calls the stall when no rank's trace has grown for ``deadline`` seconds since
        some rank made its first call (before it, the ranks are starting: importing and
        building their models, which takes longest on the busiest machines)."""
        if not self.stall_called and self.called and now - self.last_growth >= deadline:
            dirwatch.call_stall(self.directory, self.directory.name,
                                f"no rank made a call for {deadline:g} s")
            self.stall_called = True
        if self.world and self.watch is None:
            self.watch = dirwatch.TraceDirectory(self.directory, self.world,
                                                 self.directory.name)
        if self.first_stall is None and self.watch is not None \
                and dirwatch.read_proof(self.directory, self.directory.name) is None:
            found = self.watch.proof(now)
            if found is not None:
                dirwatch.write_proof(self.directory, self.directory.name, found)
        if not any(r.stalled for r in self.ranks.values()):
            return False
        if self.first_stall is None:
            self.first_stall = now
        done = True
        for number, rank in self.ranks.items():
            if rank.ended:
                continue
            stacks = self.directory / f"rank-{number}.stacks"
            written = stacks.exists() and stacks.stat().st_size > 0
            if rank.stalled:
                done &= written or now - self.first_stall > STACKS_WAIT_S
                continue
            if rank.poked_at is None:
                done = False
                if now - self.first_stall >= dirwatch.POKE_AFTER_S and rank.pid:
                    _poke(rank.pid)
                    rank.poked_at = now
                continue
            done &= written or now - rank.poked_at > STACKS_WAIT_S
        return done


def _poke(pid: int) -> None:
    """SIGUSR1: faulthandler in the rank writes its stacks to its file (autohook.py)."""
    try:
        os.kill(pid, signal.SIGUSR1)
    except OSError:
        pass


def run_command(argv: list[str], deadline: float, light: bool = False,
                quiet: bool = False, cwd: Path | None = None,
                environment: dict[str, str] | None = None) -> CommandResult:
    """Run ``argv`` (in ``cwd``, else here; with ``environment`` over this process's)
    until it ends, or until one of its process groups is hung (then stop its whole tree).
    Ctrl-C or SIGTERM stops the tree and is raised again. ``quiet``: its output is not
    shown (a re-run whose verdict is all that is wanted)."""
    root = Path(tempfile.mkdtemp(prefix="distdoctor-run-"))
    traces = root / "traces"
    traces.mkdir()
    env = {**os.environ, **(environment or {})}
    hook = autohook.write_hook(root / "hook")
    env["PYTHONPATH"] = os.pathsep.join([str(hook)] + [p for p in env.get(
        "PYTHONPATH", "").split(os.pathsep) if p])
    env.update({autohook.HOOK_DIR: str(traces), autohook.HOOK_DEADLINE: f"{deadline:g}",
                autohook.HOOK_LIGHT: "1" if light else "0"})
    before = {pid for pid, parent in tree.parents().items() if parent == os.getpid()}
    tree.subreaper(True)
    started = time.monotonic()
    try:
        process = subprocess.Popen(argv, env=env, process_group=0, cwd=cwd,
                                   stdout=subprocess.DEVNULL if quiet else None,
                                   stderr=subprocess.DEVNULL if quiet else None)
    except OSError as exc:
        tree.subreaper(False)
        shutil.rmtree(root, ignore_errors=True)
        raise CommandStartError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None

    def members() -> list[int]:
        """The command and every process it started, orphans re-parented here included
        (never this process's other children)."""
        links = tree.parents()
        roots = [process.pid] + [pid for pid, parent in links.items()
                                 if parent == os.getpid() and pid not in before]
        return sorted({pid for root in roots for pid in [root, *tree.descendants(root, links)]})
    groups: dict[Path, _Group] = {}
    hung: Path | None = None
    unformed: Unformed | None = None
    interrupted = _InterruptFlag()
    try:
        while True:
            interrupted.check()
            code = process.poll()
            for directory in sorted(traces.glob("pg-*")):
                group = groups.setdefault(directory, _Group(directory))
                group.read()
            now = time.monotonic()
            hung = next((g.directory for g in groups.values()
                         if not all(r.ended for r in g.ranks.values())
                         and g.hung(now, deadline)),
                        None)
            if hung is not None:
                break
            # before any rank: torchrun's agents meeting as nodes (first: a node that
            # went on with another --nnodes starts ranks that wait for the wrong group)
            unformed = judge_rendezvous(rendezvous.agents(traces, members), now,
                                        max(deadline, deadlines.START_S))
            if unformed is not None:
                break
            # ranks inside init_process_group trace nothing yet: a group that never forms
            # is judged from their notes (start-up by its own, longer deadline)
            stuck = joining.judge(joining.waiting(traces, members), now,
                                  max(deadline, deadlines.START_S))
            if stuck is not None:
                hung = joining.write_group(traces, stuck, now)
                groups[hung] = _Group(hung)
                break
            if code is not None and not _ranks_alive(groups, members()):
                if not groups:  # no rank ever started: the agents' own ends may say why
                    unformed = judge_rendezvous(rendezvous.agents(traces, members, ended=True),
                                                now, float("inf"), ended=True)
                # its launcher stopped ranks inside init_process_group (a peer's call
                # raised): what every rank gave the call may still prove why
                ended = joining.judge(joining.waiting(traces, members, ended=True), now,
                                      float("inf"))
                if ended is not None and ended.proof is not None:
                    found = joining.write_group(traces, ended, now)
                    groups[found] = _Group(found)
                break
            time.sleep(POLL_S)
    except BaseException:  # Ctrl-C, SIGTERM (SystemExit), or our own failure
        _stop(process, members)
        shutil.rmtree(root, ignore_errors=True)
        raise
    finally:
        interrupted.restore()
    wall = time.monotonic() - started
    _stop(process, members)  # the hung job, or whatever the command left running
    order = sorted(groups, key=_started_at)
    stopped = hung is not None or unformed is not None and code is None
    return CommandResult(None if stopped else process.returncode, tuple(order),
                         hung, wall, root, unformed)


class _InterruptFlag:
    """Ctrl-C, remembered as well as raised. Python raises KeyboardInterrupt wherever the
    main thread is when the signal is handled; inside a destructor or a weakref callback
    (which the garbage collector may run at any bytecode) it is printed as "Exception
    ignored" and lost, and the watch would go on until the deadline. The flag stops it at
    the next poll whatever happened to the exception."""

    def __init__(self) -> None:
        self.asked = False
        self.previous = None
        try:
            self.previous = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread: Ctrl-C is not ours to watch
            pass

    def _handle(self, signum, frame) -> None:
        self.asked = True
        raise KeyboardInterrupt

    def check(self) -> None:
        if self.asked:
            raise KeyboardInterrupt

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def _ranks_alive(groups: dict[Path, _Group], members: list[int]) -> bool:
    """Is any traced rank still running (the command ended, its ranks not: they are this
    process's now, as the subreaper)?"""
    for group in groups.values():
        for rank in group.ranks.values():
            if rank.pid and not rank.ended and rank.pid in members and tree.alive([rank.pid]):
                return True
    return False


def _stop(process: subprocess.Popen, members) -> None:
    """Kill the command's whole tree, reap it, and stop being a subreaper."""
    try:
        tree.kill_all(members)
        left = members()
        process.wait()
        tree.reap(left, block_for=2.0)
    finally:
        tree.subreaper(False)


def _started_at(directory: Path) -> tuple[float, str]:
    """Groups in the order their first rank started tracing (by its trace's birth)."""
    times = [p.stat().st_mtime for p in directory.glob("rank-*.jsonl")]
    try:
        first = min(json.loads(p.read_bytes().partition(b"\n")[0]).get("t", 0.0)
                    for p in directory.glob("rank-*.jsonl"))
    except (ValueError, OSError, AttributeError):
        first = min(times, default=0.0)
    return float(first), directory.name
