"""``distdoctor attach PID``: a job already running (hung, usually), started without us.

PID is the job's launcher (torchrun's agent, an ``mp.spawn`` parent, a shell) or one of its
ranks. Nothing is asked of the job that changes it: its processes are found through
/proc, each rank's Python stacks are read by py-spy without pausing it (pyspy.py), several
times, and the Flight Recorder's dump is asked for only where the job itself opened torch's
dump pipe for that (nccl's ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``: a byte written there makes
the rank dump its recorder to ``TORCH_FR_DUMP_TEMP_FILE<rank>`` and train on).

What the reads show is written in the tracer's own vocabulary (a rank blocked in
``dist.all_reduce`` at the user's line is an open call; one blocked inside DDP's forward
or backward is a collective torch made itself, in flight), so the same checks and the same
report as ``run`` and ``analyze`` name the cause. A stack has no sequence numbers: ranks
waiting in different collectives, or some in one and others busy or gone, are told apart
from it; ranks all waiting in the same call, whose sequences parted earlier, need the
recorder's history (the report says so).

How a process is known as a rank, and its number: RANK in its environment (torchrun,
Slurm with torchrun's variables, accelerate, deepspeed); ``mp.spawn``'s child wrapper's
index ``i``; else a process inside ``torch.distributed`` at all, numbered by its own
``rank`` variable if a frame holds one, else in the order the launcher started them.
A process under a rank (a DataLoader worker) is never one.
"""

from __future__ import annotations

import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from distdoctor.dumps.read import load
from distdoctor.launch import tree
from distdoctor.models import RankEnd
from distdoctor.models.calls import INIT_GROUP, TRACED_OPS
from distdoctor.models.events import Ev
from distdoctor.models.record import InFlight, is_user_frame, seen_most_first, user_frame
from distdoctor.trace.startup import LAUNCHER_VARIABLES, init_fields
from distdoctor.userjob.attaching import pyspy

READS = 4  # reads of each rank's stacks; a rank whose reads all agree has not moved
READ_GAP_S = 0.3
# tries of a rank's first read: py-spy can fail on a live process (a torn read, or its 10 s
# timeout while a busy machine loads libtorch's symbols), which is not the rank ending
FIRST_READ_TRIES = 3
DUMP_WAIT_S = 15.0  # for a rank's Flight Recorder dump after its pipe was written (a
# rank's first dump with stack traces takes 4 s here: torch sets up its symbolizer)
PIPE_VARIABLES = ("TORCH_FR_DEBUG_INFO_PIPE_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
DUMP_VARIABLES = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
# what every rank of one job shares: its rendezvous, as its launcher set it
RENDEZVOUS_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
_WANTED = (*LAUNCHER_VARIABLES, *RENDEZVOUS_VARIABLES, *PIPE_VARIABLES, *DUMP_VARIABLES,
           "XDG_CACHE_HOME", "HOME", "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
_C10D = os.path.join("torch", "distributed", "distributed_c10d.py")
_DDP = os.path.join("nn", "parallel", "distributed.py")
_TORCH_DISTRIBUTED = os.path.join("torch", "distributed", "")
_LAUNCHERS = tuple(os.path.join("torch", "distributed", part) for part in
                   ("elastic", "run.py", "launch.py", "launcher"))


@dataclass(frozen=True)
class Read:
    """One read of a rank: its stacks, and how much its main thread had run by then (CPU
    ticks and context switches, from /proc): a thread blocked in a collective adds to
    neither, one in a loop that looks the same at every read (all-reduces with no counter)
    adds to both."""

    snapshot: pyspy.Snapshot
    activity: int


def _activity(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/task/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/task/{pid}/status").read_text()
    except OSError:
        return -1  # gone
    fields = stat[stat.rfind(")") + 2:].split()
    switches = sum(int(line.split()[1]) for line in status.splitlines()
                   if line.endswith("ctxt_switches:") or "ctxt_switches:" in line)
    return int(fields[11]) + int(fields[12]) + switches  # utime + stime + switches


def _read(pid: int) -> Read:
    activity = _activity(pid)
    return Read(pyspy.dump(pid), activity)


def _first_read(pid: int) -> Read:
    """A process's first read, tried again while it is still alive: only a process that
    is gone may be left out of the job as gone."""
    tries = 1
    while True:
        try:
            return _read(pid)
        except pyspy.StackReadError as exc:
            if tries >= FIRST_READ_TRIES or _activity(pid) < 0 or _refused(exc):
                raise
            tries += 1


def _refused(exc: pyspy.StackReadError) -> bool:
    """No read of any process can work: py-spy is missing or may not read processes."""
    return "not permitted" in str(exc) or "not installed" in str(exc)


class AttachError(RuntimeError):
    """The job cannot be read (no such process, no ranks, stacks not readable)."""


class NoRanks(AttachError):
    """The process and its children hold no rank (yet: torchrun's agents may still be
    meeting as nodes)."""


@dataclass(frozen=True)
class RankProcess:
    rank: int
    pid: int
    how: str  # how its number was known
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Job:
    launcher: int  # the process the ranks descend from
    ranks: tuple[RankProcess, ...]
    world: int
    reads: dict[int, tuple[Read, ...]]  # by rank
    notes: tuple[str, ...]
    # by rank, a read since the reads began that failed because its frames changed under
    # py-spy (which reads without pausing): that rank moved
    missed: dict[int, str] = field(default_factory=dict)


def find(pid: int) -> Job:
    """The job ``pid`` belongs to: its ranks and a first read of each."""
    if not Path(f"/proc/{pid}").exists():
        raise AttachError(f"no process {pid}")
    try:
        os.readlink(f"/proc/{pid}/exe")
    except PermissionError:
        raise AttachError(pyspy.not_permitted(pid)) from None
    except OSError:
        pass  # a kernel thread, or gone: found to have no ranks below
    links = tree.parents()
    ranks, reads = _ranks_under(pid, links)
    if ranks and [r.pid for r in ranks] == [pid] and links.get(pid, 1) > 1:
        # PID is one rank: its job is the ranks beside it that share its rendezvous (its
        # parent's other children may be other jobs: a test runner's, a shell's)
        own = _rendezvous(ranks[0].env)
        siblings, sibling_reads = _ranks_under(links[pid], links)
        siblings = [r for r in siblings if _rendezvous(r.env) == own]
        if len(siblings) > 1:
            ranks, pid = siblings, links[pid]
            reads = {r.pid: sibling_reads[r.pid] for r in siblings}
    if not ranks:
        raise NoRanks(f"process {pid} and its children have no rank of a "
                          f"torch.distributed job (none has RANK in its environment or is "
                          f"inside torch.distributed)")
    world = max([_int(r.env.get("WORLD_SIZE")) for r in ranks]
                + [_spawned(pid, links)] + [r.rank + 1 for r in ranks])
    notes = []
    missing = sorted(set(range(world)) - {r.rank for r in ranks})
    if missing:
        notes.append(f"no process of rank{'s' * (len(missing) > 1)} "
                     f"{', '.join(map(str, missing))} under process {pid}: "
                     f"exited, or on another machine")
    return Job(pid, tuple(sorted(ranks, key=lambda r: r.rank)), world,
               {r.rank: (reads[r.pid],) for r in ranks}, tuple(notes))


def _ranks_under(root: int, links: dict[int, int]
                 ) -> tuple[list[RankProcess], dict[int, Read]]:
    found: list[RankProcess] = []
    reads: dict[int, Read] = {}
    taken: set[int] = set()
    unnumbered: list[int] = []
    for pid in [root] + tree.descendants(root, links):
        if _under(pid, taken, links) or not _is_python(pid):
            continue
        env = _environment(pid)
        try:
            read = _first_read(pid)
        except pyspy.StackReadError as exc:
            if _refused(exc):
                raise AttachError(str(exc)) from None
            number = _numbered_by_environment(env)
            if number is not None and _activity(pid) >= 0:  # a rank, running, not read:
                raise AttachError(  # never to be called one that exited
                    f"rank {number} (process {pid}) is running but its stacks could not be "
                    f"read ({exc}): attach again") from None
            continue  # gone meanwhile, or not Python after all
        number, how = _number(env, read.snapshot)
        if number is None and not _in_distributed(read.snapshot):
            continue
        taken.add(pid)
        reads[pid] = read
        if number is None:
            unnumbered.append(pid)
        else:
            found.append(RankProcess(number, pid, how, env))
    used = {r.rank for r in found}
    free = (n for n in range(len(found) + len(unnumbered)) if n not in used)
    found += [RankProcess(next(free), pid, "the order its launcher started it",
                          _environment(pid)) for pid in unnumbered]
    return found, reads


def _numbered_by_environment(env: dict[str, str]) -> int | None:
    """The rank a launcher's environment gives a process, if it gives one."""
    if env.get("RANK", "").isdigit() and ("WORLD_SIZE" in env or "LOCAL_RANK" in env):
        return int(env["RANK"])
    return None


def _number(env: dict[str, str], snapshot: pyspy.Snapshot) -> tuple[int | None, str]:
    numbered = _numbered_by_environment(env)
    if numbered is not None:
        return numbered, "RANK in its environment"
    for thread, frame_locals in zip(snapshot.threads, snapshot.locals):
        for frame, names in zip(thread.frames, frame_locals):
            if frame.function == "_wrap" and frame.file.endswith(
                    os.path.join("multiprocessing", "spawn.py")) and names.get("i", "").isdigit():
                return int(names["i"]), "mp.spawn's index"
    started = any(f.function == "_bootstrap" and f.file.endswith(
        os.path.join("multiprocessing", "process.py")) for t in snapshot.threads
        for f in t.frames)  # a multiprocessing.Process: a rank even while in its own code
    if _in_distributed(snapshot) or started:
        for thread, frame_locals in zip(snapshot.threads, snapshot.locals):
            for frame, names in zip(thread.frames, frame_locals):
                for name in ("rank", "global_rank"):
                    if is_user_frame(frame) and names.get(name, "").isdigit():
                        return int(names[name]), f"the variable {name} of {frame.function}"
    return None, ""


def _in_distributed(snapshot: pyspy.Snapshot) -> bool:
    """Is the process inside torch.distributed's communication (not its launchers: the
    torchrun agent runs in torch/distributed/elastic and run.py; nor importing it: a
    launcher read as it starts is inside torch/distributed/__init__.py)?"""
    return any((_TORCH_DISTRIBUTED in f.file and not any(part in f.file for part in _LAUNCHERS))
               or _DDP in f.file for t in snapshot.threads if not _importing(t)
               for f in t.frames)


def _importing(thread) -> bool:
    return any(f.file.startswith("<frozen importlib") for f in thread.frames)


def _rendezvous(env: dict[str, str]) -> tuple[str, ...] | None:
    """The rendezvous a rank's launcher set in its environment, or None (mp.spawn's
    children, whose script sets it in os.environ: /proc shows what they started with)."""
    found = tuple(env.get(name, "") for name in RENDEZVOUS_VARIABLES)
    return found if any(found) else None


def _spawned(launcher: int, links: dict[int, int]) -> int:
    """``nprocs`` of an ``mp.spawn`` the launcher is in, or 0."""
    if not _is_python(launcher):
        return 0
    try:
        snapshot = pyspy.dump(launcher)
    except pyspy.StackReadError:
        return 0
    for thread, frame_locals in zip(snapshot.threads, snapshot.locals):
        for frame, names in zip(thread.frames, frame_locals):
            if frame.function == "start_processes" and names.get("nprocs", "").isdigit():
                return int(names["nprocs"])
    return 0


def _under(pid: int, taken: set[int], links: dict[int, int]) -> bool:
    parent = links.get(pid)
    while parent and parent > 1:
        if parent in taken:
            return True
        parent = links.get(parent)
    return False


def _is_python(pid: int) -> bool:
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return False
    return exe.startswith("python") or exe.startswith("pypy")


def _environment(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs
            if k.decode(errors="replace") in _WANTED}


def read_again(job: Job, fresh: bool = False) -> Job:
    """More reads of every rank, READ_GAP_S apart, to READS in all (READS new ones if
    ``fresh``): a rank that moved is not waiting, nor is one whose frames changed while
    py-spy copied them (a read that timed out says neither)."""
    reads = {rank: [] if fresh else list(snaps) for rank, snaps in job.reads.items()}
    missed = {} if fresh else dict(job.missed)
    for _ in range(READS if fresh else READS - 1):
        time.sleep(READ_GAP_S)
        for process in job.ranks:
            try:
                reads[process.rank].append(_read(process.pid))
            except pyspy.FramesMoved as exc:  # it ran under the read
                missed.setdefault(process.rank, str(exc))
            except pyspy.StackReadError:
                pass  # ended meanwhile, or py-spy too slow: its last read stands
    # a rank no new read reached (py-spy failed on a busy machine, or it ended) keeps the
    # reads it had: evidence() needs one at least
    return Job(job.launcher, job.ranks, job.world,
               {r: tuple(s) or job.reads[r] for r, s in reads.items()}, job.notes, missed)


def ask_flight_recorders(job: Job) -> tuple[dict[int, object], list[str]]:
    """Each rank's Flight Recorder dump, where the job opened torch's dump pipe: written
    to, the rank dumps and trains on. Read as plain data only (never unpickled as code)."""
    dumps: dict[int, object] = {}
    notes: list[str] = []
    asked: dict[int, tuple[Path, float]] = {}
    for process in job.ranks:
        stem = next((process.env[v] for v in PIPE_VARIABLES if process.env.get(v)), None)
        if not stem:
            continue
        pipe = Path(f"{stem}{process.rank}.pipe")
        target = _dump_path(process)
        try:
            if not stat.S_ISFIFO(pipe.stat().st_mode):
                raise OSError("not a named pipe")
            before = target.stat().st_mtime if target.exists() else 0.0
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
            try:
                os.write(fd, b"1")
            finally:
                os.close(fd)
            asked[process.rank] = (target, before)
        except OSError as exc:
            notes.append(f"rank {process.rank}: could not ask for its Flight Recorder dump "
                         f"through {pipe} ({exc.strerror or exc})")
    end = time.monotonic() + DUMP_WAIT_S
    while asked and time.monotonic() < end:
        for rank, (target, before) in list(asked.items()):
            try:
                if not target.exists() or target.stat().st_mtime <= before \
                        or target.stat().st_size == 0:
                    continue
                time.sleep(0.1)  # the writer may still be at it
                dumps[rank] = load(target)
                del asked[rank]
            except FileNotFoundError:
                continue  # replaced as we read it: the next look finds the new one
            except (OSError, ValueError) as exc:
                notes.append(f"rank {rank}: its Flight Recorder dump {target} could not be "
                             f"read ({exc})")
                del asked[rank]
        time.sleep(0.05)
    notes += [f"rank {rank}: no Flight Recorder dump reached {target} within "
              f"{DUMP_WAIT_S:g} s of asking" for rank, (target, _) in asked.items()]
    return dumps, notes


def _dump_path(process: RankProcess) -> Path:
    stem = next((process.env[v] for v in DUMP_VARIABLES if process.env.get(v)), None)
    if stem is None:
        cache = process.env.get("XDG_CACHE_HOME") or os.path.join(
            process.env.get("HOME", "~"), ".cache")
        stem = os.path.join(cache, "torch", "comm_lib_trace_rank_")
    return Path(f"{stem}{process.rank}")


@dataclass(frozen=True)
class Reading:
    """What the reads of a job show, in the vocabulary of the traces: each rank's end and
    events, the ranks waiting unmoved in a collective or send/receive, and the ranks that
    moved between reads."""

    ends: tuple[RankEnd, ...]
    events: tuple[tuple[dict, ...], ...]
    waiting: tuple[int, ...]
    moving: tuple[int, ...]
    notes: tuple[str, ...]


def evidence(job: Job, dumps: dict[int, object]) -> Reading:
    """A rank that waited in the same place through every read is blocked there (an open
    call, or a collective torch made itself, in flight); one that moved is running; a
    rank with no process is gone."""
    from distdoctor.dumps.live import history_of, recorded

    ends: list[RankEnd] = []
    events: list[tuple[dict, ...]] = []
    moving: list[int] = []
    waiting_ranks: list[int] = []
    by_rank = {r.rank: r for r in job.ranks}
    for rank in range(job.world):
        if rank not in by_rank:
            ends.append(RankEnd(rank, "finished", at=0.0,
                                error="its process is gone: it exited while the others ran"))
            events.append(())
            continue
        reads = job.reads[rank]
        if not reads:  # never read at all: nothing to say where it is
            ends.append(RankEnd(rank, "hung", at=0.0,
                                error="its stacks could not be read (py-spy failed on it)"))
            events.append(())
            continue
        last = reads[-1].snapshot
        agree = len({r.snapshot.key() for r in reads}) == 1 \
            and len({r.activity for r in reads}) == 1
        still = agree and rank not in job.missed
        if not still:
            moving.append(rank)
        history = recorded(history_of(dumps.get(rank)))
        waiting = _waiting_in(last) if still else None
        call_events: tuple[dict, ...] = ()
        in_flight: tuple[InFlight, ...] = ()
        if waiting is not None and not waiting[3]:
            op, peer, where, _ = waiting
            seq = _seq_from(history, op)
            call_events = ({"ev": Ev.ENTER, "id": 1, "t": 0.0, "op": op, "seq": seq,
                            "group": list(range(job.world)), "peer": peer, "peers": [],
                            "shapes": [], "dtype": "", "reduce_op": None, "where": where,
                            "rank": rank, "async_op": False},)
        elif waiting is not None:
            in_flight = (InFlight(None, -1, waiting[0]),)
        # still waiting for its group to form: judged below, only if no rank of the job
        # moves (one still importing or loading may yet join: attach has no deadline)
        joining = _joining(last, by_rank[rank].env) if still and waiting is None else None
        if joining is not None:
            call_events = (joining,)
        if waiting is not None or joining is not None:
            waiting_ranks.append(rank)
        ends.append(RankEnd(rank, "hung", at=0.0,
                            error="its stacks did not move across the reads" if still else
                            "its stacks or its main thread's CPU time moved between reads: it "
                            "is running" if not agree else
                            f"its frames changed while py-spy read them, so it is running "
                            f"({job.missed[rank]})",
                            stacks=last.threads, in_flight=in_flight, recorded=history,
                            seen=() if still else seen_most_first(
                                [user_frame(r.snapshot.threads) for r in reads])))
        events.append(call_events)
    notes = []
    if moving:  # a start-up is judged only with every rank of the job still
        joined = [r for r, e in enumerate(events) if e and e[-1].get("ev") == Ev.INIT]
        for rank in joined:
            events[rank] = ()
        waiting_ranks = [r for r in waiting_ranks if r not in joined]
    if moving:
        notes.append(f"rank{'s' * (len(moving) > 1)} {', '.join(map(str, moving))} moved "
                     f"between the reads ({READS} reads, {READ_GAP_S:g} s apart): running")
    return Reading(tuple(ends), tuple(events), tuple(waiting_ranks), tuple(moving),
                   tuple(notes))


def _waiting_in(snapshot: pyspy.Snapshot) -> tuple[str, int | None, str, bool] | None:
    """(op, peer, user's line, made by torch itself) of the communication the main thread
    is inside: a ``torch.distributed`` function, or DDP's own collectives (its forward's
    broadcasts, its backward's all-reduces); None when it is in neither."""
    main = next((t for t in snapshot.threads if t.main), None)
    if main is None:
        return None
    index = snapshot.threads.index(main)
    frame_locals = snapshot.locals[index] if index < len(snapshot.locals) else ()
    own = [f for f in main.frames if is_user_frame(f)]
    where = own[-1].place if own else ""
    for position, frame in enumerate(main.frames):  # outermost first: the user's call
        if frame.file.endswith(_C10D) and frame.function in TRACED_OPS:
            names = frame_locals[position] if position < len(frame_locals) else {}
            peer_arg = TRACED_OPS[frame.function][0]
            peer = names.get(peer_arg or "", "")
            return frame.function, int(peer) if peer.isdigit() else None, where, False
    files = [f.file for f in main.frames]
    if any(f.endswith(_DDP) for f in files) and any(
            f.function in ("_pre_forward", "_sync_buffers", "_sync_module_buffers",
                           "_distributed_broadcast_coalesced") for f in main.frames):
        return "broadcast", None, where, True
    if any(f.function in ("backward", "_engine_run_backward") and os.sep + "torch" + os.sep
           in f.file for f in main.frames):
        return "allreduce", None, where, True
    return None


def _joining(snapshot: pyspy.Snapshot, env: dict[str, str]) -> dict | None:
    """An Ev.INIT event, as the tracer writes it, for a rank whose main thread is inside
    init_process_group: its arguments from that frame's locals (py-spy reads them without
    stopping the rank), the launcher's variables from /proc; None when it is not."""
    main = next((t for t in snapshot.threads if t.main), None)
    if main is None:
        return None
    index = snapshot.threads.index(main)
    frame_locals = snapshot.locals[index] if index < len(snapshot.locals) else ()
    for position, frame in enumerate(main.frames):
        if frame.file.endswith(_C10D) and frame.function == INIT_GROUP:
            names = frame_locals[position] if position < len(frame_locals) else {}
            own = [f for f in main.frames if is_user_frame(f)]
            bound = {"backend": _text(names.get("backend")),
                     "init_method": _text(names.get("init_method")),
                     "rank": _signed(names.get("rank")),
                     "world_size": _signed(names.get("world_size"))}
            return {"ev": Ev.INIT, "t": 0.0, "where": own[-1].place if own else "",
                    **init_fields(bound, env)}
    return None


def _text(value: str | None) -> str | None:
    """A string local as py-spy shows it ('gloo', quoted), or None."""
    if value and len(value) > 1 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return None


def _signed(value: str | None) -> int | None:
    return int(value) if value and re.fullmatch(r"-?\d+", value) else None


def _seq_from(history, op: str) -> int:
    """The number of the open call on the default group, by the recorder: its last entry
    of that op; -1 (not known) without a recorder."""
    numbers = [r.seq for r in history if r.pg is None and r.op.replace("_", "") ==
               op.replace("_", "")]
    return max(numbers) if numbers else -1


def _int(text: str | None) -> int:
    return int(text) if text and re.fullmatch(r"\d+", text) else 0
