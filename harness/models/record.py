"""One run as it happened: each rank's evidence and how its job ended (finished, raised,
died, hung or stopped, with its traceback or stacks)."""

from __future__ import annotations

import os
import signal
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from distdoctor.models.evidence import Evidence
from distdoctor.models.spec import RunSpec

SCHEMA_VERSION = 1
FATAL = "Fatal Python error:"  # faulthandler's first line for a fatal signal (Aborted, ...)
# how a rank's job ended: the one spelling of each (mypy's strict_equality refuses a
# comparison with any other string)
RankStatus = Literal["finished", "raised", "died", "hung", "stopped"]
STOPPED: tuple[RankStatus, ...] = ("hung", "stopped")  # left blocked where it was
ENDED: tuple[RankStatus, ...] = ("finished", "raised", "died")  # makes no call after
CRASHED: tuple[RankStatus, ...] = ("raised", "died")  # ended by an error, a code or a signal


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str
    code: str = ""

    def __str__(self) -> str:
        text = f'  File "{self.file}", line {self.line or "unknown"}, in {self.function}'
        return f"{text}\n    {self.code}" if self.code else text

    @property
    def place(self) -> str:
        """'file:line', or 'file (line unknown)' where no line could be resolved (a line 0
        is never written: launch/stacks.py and trace/lines.py resolve what they can)."""
        return f"{self.file}:{self.line}" if self.line else f"{self.file} (line unknown)"


@dataclass(frozen=True)
class Seen:
    """A line a running rank's main thread was seen at, and in how many of the samples
    taken as it was stopped: a spinning rank moves, so one sample can land anywhere in
    its loop, and the line it is seen at most is the one to look at."""

    frame: Frame
    times: int
    of: int  # samples taken in all

    @property
    def where(self) -> str:
        return self.frame.place


class Sighting(Protocol):
    """A line and how often it was seen: a Seen, or the report's ReportSeen."""

    @property
    def where(self) -> str: ...
    @property
    def times(self) -> int: ...
    @property
    def of(self) -> int: ...


def seen_at_text(seen: Sequence[Sighting]) -> str:
    """" (seen at a.py:9 (8 of 12), a.py:8 (4 of 12))", to follow where a running rank is
    said to be, where it was seen at more than one line; "" otherwise (the one line is
    already where it is said to be)."""
    if len(seen) < 2:
        return ""
    return " (seen at " + ", ".join(f"{s.where} ({s.times} of {s.of})" for s in seen) + ")"


def seen_most_first(frames: list[Frame | None]) -> tuple[Seen, ...]:
    """The user's lines sampled ``frames`` were at, most frequent first (then in file and
    line order); a sample with no user frame counts in ``of`` only, and a line that could
    not be resolved (0) only where no sample resolved one."""
    counts: dict[Frame, int] = {}
    for frame in frames:
        if frame is not None:
            counts[frame] = counts.get(frame, 0) + 1
    known = {f: n for f, n in counts.items() if f.line} or counts
    ordered = sorted(known.items(), key=lambda item: (-item[1], item[0].file, item[0].line))
    return tuple(Seen(frame, times, len(frames)) for frame, times in ordered)


@dataclass(frozen=True)
class ThreadStack:
    """One thread's Python stack, outermost frame first."""

    name: str
    main: bool
    frames: tuple[Frame, ...]

    def __str__(self) -> str:
        head = f"Thread {self.name}{' (main)' if self.main else ''}, most recent call last:"
        return "\n".join([head, *map(str, self.frames)])


# code that is not the user's: distdoctor itself, the standard library, installed packages,
# and the environment's entry scripts (.venv/bin/distdoctor, bin/torchrun)
_NOT_USER = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
             os.path.dirname(os.__file__) + os.sep, os.sep + "site-packages" + os.sep,
             os.sep + "dist-packages" + os.sep,
             os.path.abspath(sysconfig.get_path("scripts")) + os.sep)


def is_user_frame(frame: Frame) -> bool:
    """Is this frame the user's own code (not distdoctor's, the standard library's or an
    installed package's)?"""
    return not frame.file.startswith("<") and not any(part in frame.file for part in _NOT_USER)


def user_frame(stacks: tuple[ThreadStack, ...]) -> Frame | None:
    """The innermost frame of the main thread in the user's own code: where a rank that
    is in no call was running."""
    main = next((s for s in stacks if s.main), stacks[0] if stacks else None)
    own = [f for f in (main.frames if main else ()) if is_user_frame(f)]
    return own[-1] if own else None


def started_by(frame: Frame) -> str:
    """How a user's line led where a rank waits: "started by loss.backward() at
    train.py:31", or "from train at train.py:31" when the line's text is not known."""
    code = frame.code.split("  #")[0].split(" # ")[0].strip()  # not its comment
    if code:
        return f"started by {code} at {frame.place}"
    return f"from {frame.function} at {frame.place}"


def _made_by(stacks: tuple[ThreadStack, ...], op: str) -> str:
    """What made an untraced collective, from the main thread's stack: a backward pass
    (DDP's gradient hooks), DDP's forward (its buffer and bucket broadcasts), or else torch
    itself."""
    main = next((s for s in stacks if s.main), stacks[0] if stacks else None)
    frames = main.frames if main else ()
    torch_dir = os.sep + "torch" + os.sep
    if any(f.function in ("backward", "_engine_run_backward") and torch_dir in f.file
           for f in frames):
        return "DDP's gradient all-reduce" if "allreduce" in op.replace("_", "") else \
            f"a {op} of the backward pass (DDP's or a hook's)"
    if any(f.file.endswith(os.path.join("nn", "parallel", "distributed.py")) for f in frames):
        return f"DDP's own {op} in its forward"
    return f"a {op} torch made itself, not through torch.distributed's Python functions"


@dataclass(frozen=True)
class Recorded:
    """One collective in a rank's Flight Recorder: its number on its group (``pg``: None
    for the default group) as the backend pairs them, whoever made it (the user, DDP,
    FSDP, DTensor), its kind, input sizes and dtype, and the user's innermost line that
    led to it ("" when none of the user's frames was recorded)."""

    pg: str | None
    seq: int
    op: str
    sizes: tuple[tuple[int, ...], ...]
    dtype: str
    where: str = ""


@dataclass(frozen=True)
class InFlight:
    """A collective a stopped rank had enqueued and not completed, and not through a traced
    call, by torch's Flight Recorder: numbered on its group (``pg``: None for the default
    group) as the backend pairs them (DDP makes its own from C++, never traced); a
    negative ``seq`` when it was read from the rank's Python stack (``attach``), not
    numbered."""

    pg: str | None
    seq: int
    op: str


@dataclass(frozen=True)
class RankEnd:
    """How one rank's job ended: its traceback if it raised, its stacks if it was stopped."""

    rank: int
    status: RankStatus
    at: float | None = None  # seconds after the job started
    error: str | None = None  # full traceback text, or how the process died
    exitcode: int | None = None
    stacks: tuple[ThreadStack, ...] = ()  # every thread, captured before the rank was killed
    raw_stack: str | None = None  # faulthandler text, when the rank could not answer itself
    stderr: str = ""  # the tail of what the rank wrote to stderr during the job
    in_flight: tuple[InFlight, ...] = ()  # its untraced collectives in flight when stopped
    # every collective its Flight Recorder still held when it was stopped (the newest 2000
    # by default), torch's own included: the sequences the hang check compares
    recorded: tuple[Recorded, ...] = ()
    # the lines its main thread was seen at, sampled several times as it was stopped (a
    # rank spinning in its own code moves): most frequent first
    seen: tuple[Seen, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "finished"

    @property
    def running_at(self) -> Frame | None:
        """Where a rank stopped in its own code was: the line it was seen at most, else
        the innermost user frame of its one stack."""
        return self.seen[0].frame if self.seen else user_frame(self.stacks)

    @property
    def collective(self) -> str | None:
        """The last collective it had in flight that torch made itself (DDP's, from C++),
        by the Flight Recorder, as a phrase: "waiting in DDP's gradient all-reduce
        (allreduce #8 of the default group, by torch's Flight Recorder)"."""
        if not self.in_flight:
            return None
        last = self.in_flight[-1]
        if last.seq < 0:  # read from the rank's Python stack, not from its recorder
            return f"waiting in {_made_by(self.stacks, last.op)} (by its Python stack)"
        group = f"process group {last.pg}" if last.pg else "the default group"
        return (f"waiting in {_made_by(self.stacks, last.op)} ({last.op} #{last.seq} of "
                f"{group}, by torch's Flight Recorder)")

    @property
    def headline(self) -> str:
        """The exception line of the last traceback in ``error``; for a rank that died, the
        C++ exception it died of ("what(): ..."); else the last line."""
        lines = (self.error or "").rstrip().splitlines()
        fatal = [line.strip() for line in lines if line.strip().startswith("what():")]
        if self.status == "died" and fatal:
            return fatal[-1]
        starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
        if starts:
            for line in lines[starts[-1] + 1:]:
                if line and not line[0].isspace():
                    return line
        return lines[-1].strip() if lines else ""


# What gloo raises on a rank whose peer failed: the symptom, never the cause.
# a peer (or the store's host) went away: gloo's pairs, and the store's client (a rank
# still inside init_process_group when the rank hosting its store exited)
_PEER_FAILURE_MESSAGES = ("Connection reset by peer", "Connection closed by peer",
                          "Broken pipe", "Connection was likely closed")


SIZE_MISMATCH = "Received data size doesn't match expected size"  # gloo's, as it aborts


def is_size_mismatch(end: RankEnd) -> bool:
    """Did gloo end this rank for a collective whose size its peer did not share?"""
    return end.status in CRASHED and SIZE_MISMATCH in (end.error or "") + end.stderr


def aborted_in_collective(end: RankEnd) -> str | None:
    """The collective a rank was aborted in (SIGABRT, its stacks dumped by faulthandler, as
    the torchrun path leaves them), by its main thread's innermost frame of
    torch.distributed's collectives; None if it was not. Under gloo a rank is aborted in a
    collective when the sizes its peers sent do not match its own (their message goes to
    the launcher's stderr, which the traces do not hold)."""
    if end.status != "died" or end.exitcode != -signal.SIGABRT:
        return None
    main = next((t for t in end.stacks if t.main), None)
    for frame in reversed(main.frames if main else ()):
        if frame.file.endswith(("distributed_c10d.py", "_functional_collectives.py")):
            return frame.function
    return None


def is_peer_echo(end: RankEnd) -> bool:
    """Did this rank only fail because a peer went away?"""
    return end.status == "raised" and any(m in end.headline for m in _PEER_FAILURE_MESSAGES)


@dataclass(frozen=True)
class RankRecord:
    rank: int
    end: RankEnd
    evidence: Evidence


@dataclass(frozen=True)
class RunRecord:
    """One run: its spec, each rank's evidence and end, and how long it took."""

    spec: RunSpec
    ranks: tuple[RankRecord, ...]
    wall_s: float
    torch_version: str = ""
    schema_version: int = SCHEMA_VERSION
    started: float = 0.0  # job start on the machine-wide monotonic clock (RankEnd.at is after it)

    @property
    def finished(self) -> bool:
        return all(r.end.ok for r in self.ranks)
