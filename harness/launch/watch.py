"""The parent's watch over one job: read every rank until each has ended or been stopped.

Progress is any message from a rank, or a rank loading code (its module count grows:
trace/loading.py). With no progress from any running rank for
``deadline`` seconds, every running rank's stacks are taken and it is killed ("hung"). After
the first rank raises or dies, the others get ``error_grace`` seconds to end by themselves,
then the same ("stopped"). Each rank's stderr and trace pipes are read as they come, so a
chatty rank never blocks, a dying rank's last words are kept, and the tracer's record of
the call a rank is blocked in arrives before the rank is stopped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Callable, cast

from distdoctor.analysis.waitfor import PROOF_SWITCH, PROVEN, Confirmation, WaitFor, collective
from distdoctor.dumps.live import recorded
from distdoctor.launch import procs, stacks
from distdoctor.launch.results import JobResult
from distdoctor.models import InFlight, RankEnd, RankStatus
from distdoctor.models.record import FATAL

# torch's Flight Recorder (live.py) is asked for when a rank waits in a collective it does
# not yet place: at once while a proof is being confirmed, else after this long with no
# new line from any rank (a straggler's peers, a rank inside DDP's C++ collectives) ...
FLIGHT_QUIET = 0.2
FLIGHT_EVERY = (0.1, 1.0)  # ... and again no sooner than this, with a proof or without
FLIGHT_TIMEOUT = 0.25  # a rank whose stack thread does not answer by then is not placed
HISTORY_TIMEOUT = 2.0  # each rank's whole Flight Recorder, with frames: longer to dump
ABORT_WAIT_S = 5.0  # for a rank that began to abort to end: its dump, then the signal
SEEN_TIMEOUT = 2.0  # a dozen samples 5 ms apart (trace/lines.SAMPLE_BUDGET_S at most),
# then the answer, each waiting its turn at the GIL on a machine whose cores are taken
LOADED_TIMEOUT = 0.25  # a module count: one len(), once the stack thread has the GIL

STDERR_TAIL = 16384  # bytes of each rank's stderr kept in its end
TRACE_REST = 0.05  # seconds a trace pipe is left alone after a read: one wake-up per call
# would cost the ranks a share of the cores; 1 MB pipes hold far more than 50 ms of calls


@dataclass
class RankHandle:
    """The parent's end of one rank process."""

    rank: int
    process: Any  # a BaseProcess, or userjob's ForkedProcess or PopenProcess, alike to it
    conn: Connection
    ctrl: Connection
    faulthandler_fd: int
    stderr_fd: int
    trace_fd: int
    stdout_fd: int | None = None  # a pipe of its own where the launcher passes output on


class JobWatch:
    """The parent's side of one job: watch every rank until each has ended or been stopped."""

    def __init__(self, ranks: list[RankHandle], deadline: float, error_grace: float,
                 echo: Callable[[int, str, bytes], None] | None = None,
                 limit: float | None = None, exit_zero_finishes: bool = False):
        """``limit``: seconds the job may run in all, progress or not (a test's deadline);
        None: only the no-progress ``deadline`` stops it. ``echo(rank, stream, chunk)`` is
        given what each rank writes to stderr (and stdout, where it has a pipe) as it
        comes. ``exit_zero_finishes``: a rank that exits with code 0 without reporting has
        finished (a user's script leaving by ``os._exit(0)``), not died; a warm pool's
        ranks never leave on their own, so there it stays a death."""
        self.exit_zero_finishes = exit_zero_finishes
        self.ranks = ranks
        self.deadline = deadline
        self.limit = limit
        self.error_grace = error_grace
        self.ends: dict[int, RankEnd] = {}
        self.values: dict[int, Any] = {}
        self.events: dict[int, list[Any]] = {h.rank: [] for h in ranks}
        self.first_error: float | None = None
        self.started = procs.now()
        self.last_progress = {h.rank: self.started for h in ranks}
        self.stderr = {h.rank: _Tail() for h in ranks}
        self.trace = {h.rank: _Lines() for h in ranks}
        self.echo = echo
        self.waitfor = WaitFor([h.rank for h in ranks])
        self.prove = os.environ.get(PROOF_SWITCH, "1") != "0"
        self.confirm = Confirmation()  # a proof, until it has held long enough
        self.last_line = self.started  # when a trace line was last read, from any rank
        self.loaded: dict[int, int] = {}  # each rank's module count when last asked ...
        self.counted = float("-inf")  # ... at this moment
        self.asked = float("-inf")  # when the Flight Recorder was last asked for
        self.resting: dict[int, float] = {}  # trace fd -> when it may be read again
        self.streams: dict[int, tuple[int, Any]] = {}  # fd -> (rank, reader), while open
        self.names: dict[int, str] = {}  # fd -> "stdout" or "stderr", for echo
        for h in ranks:
            self.streams[h.stderr_fd] = (h.rank, self.stderr[h.rank])
            self.streams[h.trace_fd] = (h.rank, self.trace[h.rank])
            self.names[h.stderr_fd] = "stderr"
            if h.stdout_fd is not None:
                self.streams[h.stdout_fd] = (h.rank, _Tail())
                self.names[h.stdout_fd] = "stdout"
            for fd in (h.stderr_fd, h.trace_fd):
                _read_available(fd)  # left over from an earlier job: not ours

    def run(self, payload: bytes) -> JobResult:
        for handle in self.ranks:
            handle.conn.send_bytes(payload)
        while True:
            running = [h for h in self.ranks if h.rank not in self.ends]
            if not running:
                break
            flight_due = self._flight_due()
            if flight_due <= procs.now():
                self._ask_flight(running)
            if self._proven(running):
                break
            if self._count_due(running) <= procs.now():
                self._count_modules(running)
            timeout = min(self._time_left(running), max(0.0, flight_due - procs.now()),
                          max(0.0, self._count_due(running) - procs.now()))
            due = self.confirm.due()
            if due is not None:
                timeout = min(timeout, max(0.0, due - procs.now()))
            now = procs.now()
            awake = [fd for fd in self.streams if self.resting.get(fd, 0.0) <= now]
            wake = min((t for t in self.resting.values() if t > now), default=now + timeout)
            watched: list[Any] = [h.conn for h in running] + [h.process.sentinel for h in running]
            pause = min(timeout, wake - now)
            ready = wait(watched + awake, max(0.0, pause)) if pause > 0 else []
            if not ready:
                if timeout > pause:
                    continue  # a trace pipe's rest is over: watch it again
                self._read_streams(list(self.streams))  # calls entered since the last look
                if self._time_left(running) > 0 or self.first_error is None and (
                        self.confirm.due() is not None or self._flight_due() <= procs.now()
                        or self._count_modules(running) and self._time_left(running) > 0):
                    continue  # progress after all (a call, or code loaded), a proof being
                    # confirmed, or a question
                # (an error grace ends when it ends, whatever proof is being confirmed)
                self._stop(running, "stopped" if self.first_error is not None else "hung")
                break
            self._read_streams(set(ready) & set(self.streams))
            for handle in running:
                if handle.conn in ready or handle.process.sentinel in ready:
                    self._drain(handle)
        self._read_streams(list(self.streams))
        return JobResult(
            ends=tuple(dataclasses.replace(self.ends[h.rank], stderr=str(self.stderr[h.rank]))
                       for h in self.ranks),
            values=tuple(self.values.get(h.rank) for h in self.ranks),
            events=tuple(tuple(self.events[h.rank]) for h in self.ranks),
            wall_s=procs.now() - self.started,
            traces=tuple(tuple(self.trace[h.rank].items) for h in self.ranks),
            started=self.started,
        )

    def _proven(self, running: list[RankHandle]) -> bool:
        """Stop the ranks once a hang is proven and has held for CONFIRM_S: its calls still
        open, and no new line from its ranks. During a failed rank's error grace too, once
        every rank still running is in the proof: a rank proven to wait for ranks that
        ended (or for ranks that do) has nothing left to say but the connection error it
        would echo, which at 32 ranks takes longer to come than the proof (0.6 s against
        0.2 s here); a rank outside it (still starting, or computing) gets the grace."""
        if not self.prove:
            return False
        proof = self.waitfor.proof()
        if proof is not None and self.first_error is not None and \
                not {h.rank for h in running} <= set(proof.ranks):
            proof = None  # a rank outside the proof may still end by itself in the grace
        seen = proof and self._seen(proof.ranks)
        if not self.confirm.offer(proof, seen, procs.now()) or proof is None:
            return False
        self._read_streams(list(self.streams))  # a last look: a call may have just returned
        again = self.waitfor.proof()
        if again is None or again.calls != proof.calls or \
                self._seen(proof.ranks) != seen:
            self.confirm.drop()
            return False
        self._stop(running, "hung" if self.first_error is None else "stopped",
                   f"{PROVEN}: {proof.text}")
        return True

    def _count_due(self, running: list[RankHandle]) -> float:
        """When to read the ranks' module counts: halfway through a quiet deadline, so
        that at its end a rank still loading code is told from one that stopped."""
        latest = max(self.last_progress[h.rank] for h in running)
        if self.first_error is not None or self.counted >= latest:
            return float("inf")
        return latest + self.deadline / 2

    def _count_modules(self, running: list[RankHandle]) -> bool:
        """Read each rank's module count; a rank whose count changed since it was last
        read has made progress now. Whether any had."""
        counts = stacks.ask([h.ctrl for h in running], "loaded", LOADED_TIMEOUT)
        now = self.counted = procs.now()
        moved = False
        for index, count in counts.items():
            rank = running[index].rank
            if self.loaded.get(rank, count) != count:
                self.last_progress[rank] = now
                moved = True
            self.loaded[rank] = count
        return moved

    def _flight_due(self) -> float:
        """When to ask the Flight Recorder next (inf: no need)."""
        if not self.prove or self.first_error is not None or not self.waitfor.needs_flight():
            return float("inf")
        if self.confirm.due() is not None:
            return self.asked + FLIGHT_EVERY[0]
        return max(self.last_line + FLIGHT_QUIET, self.asked + FLIGHT_EVERY[1])

    def _ask_flight(self, running: list[RankHandle]) -> None:
        """Each running rank's collectives in flight. A view counts only for a rank that
        made no call event from just before the question to just after the answer, so it
        belongs to the call the rank is in."""
        self._read_streams(list(self.streams))
        before = {h.rank: self.waitfor.ranks[h.rank].events for h in running}
        answers = stacks.ask([h.ctrl for h in running], "collectives", FLIGHT_TIMEOUT)
        self._read_streams(list(self.streams))
        for index, view in answers.items():
            rank = running[index].rank
            if view and self.waitfor.ranks[rank].events == before[rank]:
                self.waitfor.flight(rank, view)
        self.asked = procs.now()

    def _untraced(self, rank: int, view: dict | None) -> tuple[InFlight, ...]:
        """The collectives in flight on ``rank`` by the Flight Recorder (flight.in_flight),
        less the newest one per traced collective still open on its group: the ones torch
        made itself."""
        opened: dict[str | None, int] = {}
        for call in self.waitfor.ranks[rank].open.values():
            if collective(call.event):
                opened[call.event.get("pg")] = opened.get(call.event.get("pg"), 0) + 1
        found = []
        for pg, group in (view or {}).items():
            seqs = sorted(group["ops"])
            found += [InFlight(pg, seq, group["ops"][seq])
                      for seq in seqs[:len(seqs) - opened.get(pg, 0)]]
        return tuple(sorted(found, key=lambda f: (f.pg or "", f.seq)))

    def _seen(self, ranks) -> tuple[int, ...]:
        """Trace bytes read so far from each of ``ranks``: equal means no new line."""
        return tuple(len(self.trace[r].data) for r in ranks)

    def _read_streams(self, fds) -> None:
        for fd in fds:
            rank, reader = self.streams[fd]
            chunk = _read_available(fd)
            if reader is self.trace[rank]:
                self.resting[fd] = procs.now() + TRACE_REST
            if chunk and reader is self.trace[rank]:
                self.last_progress[rank] = self.last_line = procs.now()  # it is moving
                self.waitfor.feed(rank, chunk)
            elif chunk and self.echo is not None:
                self.echo(rank, self.names[fd], chunk)
            if not reader.add(chunk):
                del self.streams[fd]  # the rank closed it: it has exited
                self.resting.pop(fd, None)

    def _time_left(self, running: list[RankHandle]) -> float:
        if self.first_error is not None:
            return self.first_error + self.error_grace - procs.now()
        latest = max(self.last_progress[h.rank] for h in running)
        ends = latest + self.deadline
        if self.limit is not None:
            ends = min(ends, self.started + self.limit)
        return ends - procs.now()

    def _drain(self, handle: RankHandle) -> None:
        """Read everything a rank has sent; notice if its process is gone."""
        rank = handle.rank
        try:
            while rank not in self.ends and handle.conn.poll():
                self._handle(rank, handle.conn.recv())
        except (EOFError, OSError):
            pass
        if rank not in self.ends and not handle.process.is_alive():
            handle.process.join()
            tail = self.stderr[rank]
            # its last words, all written before it died: kept, and passed on like the rest
            self._read_streams([fd for fd in (handle.stderr_fd, handle.stdout_fd)
                                if fd in self.streams])
            if self.exit_zero_finishes and handle.process.exitcode == 0:
                self._end(RankEnd(rank, "finished", at=procs.now() - self.started, exitcode=0))
                return
            last_words = f"; its stderr ended with:\n{tail.last_lines(60)}" if str(tail) else ""
            self._end(RankEnd(rank, "died", at=procs.now() - self.started,
                              error=describe_exit(handle.process) + last_words,
                              exitcode=handle.process.exitcode))

    def _handle(self, rank: int, message: tuple) -> None:
        kind, at = message[0], message[1]
        self.last_progress[rank] = procs.now()
        if kind == "event":
            self.events[rank].append(message[2])
        elif kind == "done":
            self.values[rank] = message[2]
            self._end(RankEnd(rank, "finished", at=at - self.started))
        elif kind == "raised":
            self._end(RankEnd(rank, "raised", at=at - self.started, error=message[2]))

    def _end(self, end: RankEnd) -> None:
        self.ends[end.rank] = end
        self.waitfor.finished(end.rank, end.status)  # it makes no more calls
        if not end.ok and self.first_error is None:
            self.first_error = procs.now()
            self.confirm.drop()  # the error grace decides now: a half-confirmed proof
            # left here would keep the loop waking at once, forever

    def _stop(self, running: list[RankHandle], status: str, why: str | None = None) -> None:
        """Take the stacks of every rank still running, then kill them."""
        at = procs.now() - self.started
        if why is None and status == "hung" and self.limit is not None \
                and at >= self.limit - 0.01:
            why = f"still running at the deadline of {self.limit:.1f} s"
        why = why or (f"no rank made progress for {self.deadline:.1f} s" if status == "hung"
                      else f"still running {self.error_grace:.1f} s after another rank failed")
        flights = stacks.ask([h.ctrl for h in running], "collectives", FLIGHT_TIMEOUT)
        untraced = {h.rank: self._untraced(h.rank, flights.get(i)) for i, h in enumerate(running)}
        # every collective each rank's recorder holds, torch's own included, where a rank
        # waits in one of torch's own: the traced calls cannot tell where those parted.
        # Only then: at 32 ranks on 2 cores the dumps take a second or more
        histories = stacks.ask([h.ctrl for h in running], "history", HISTORY_TIMEOUT) \
            if any(untraced.values()) else {}
        answers = stacks.request_stacks(
            [(h.ctrl, h.process.pid or 0, h.faulthandler_fd) for h in running])
        seen = stacks.ask([h.ctrl for h in running], "seen", SEEN_TIMEOUT)
        for index, (handle, (threads, raw)) in enumerate(zip(running, answers)):
            # it may have ended while we asked (a receive's own deadline can expire at the
            # same moment): what it said of itself, or its exit, beats "hung"
            if handle.stderr_fd in self.streams:
                self._read_streams([handle.stderr_fd])
            if f"{FATAL} Aborted" in str(self.stderr[handle.rank]) \
                    and handle.process.is_alive():
                # aborting by itself (gloo on a size mismatch), its stacks still being
                # written under load: its end is its own abort, not our stop
                handle.process.join(ABORT_WAIT_S)
            self._drain(handle)
            if handle.rank not in self.ends:
                self.ends[handle.rank] = RankEnd(handle.rank, cast(RankStatus, status), at=at,
                                                 error=why,
                                                 stacks=threads, raw_stack=raw,
                                                 in_flight=untraced[handle.rank],
                                                 recorded=recorded(histories.get(index)),
                                                 seen=seen.get(index, ()))
        procs.signal_kill([handle.process for handle in running])  # the owner reaps them
        stopped = {handle.rank for handle in running}
        for fd in [fd for fd, (rank, _) in self.streams.items() if rank in stopped]:
            del self.streams[fd]  # what they wrote while dying is not evidence
            self.resting.pop(fd, None)


class _Lines:
    """JSON lines as they arrive, kept as bytes and parsed only when asked for."""

    def __init__(self) -> None:
        self.data = bytearray()

    def add(self, chunk: bytes | None) -> bool:
        if chunk is None:
            return True
        self.data += chunk
        return bool(chunk)

    @property
    def items(self) -> list[dict]:
        parsed = []
        for line in bytes(self.data).split(b"\n"):
            if line:
                try:
                    parsed.append(json.loads(line))
                except ValueError:
                    pass  # a line cut by a killed writer
        return parsed


class _Tail:
    """The last STDERR_TAIL bytes a rank wrote to stderr."""

    def __init__(self) -> None:
        self.data = b""

    def add(self, chunk: bytes | None) -> bool:
        """Keep ``chunk``; False when the writer has closed its end."""
        if chunk is None:
            return True
        self.data = (self.data + chunk)[-STDERR_TAIL:]
        return bool(chunk)

    def last_lines(self, count: int) -> str:
        return "\n".join(str(self).rstrip().splitlines()[-count:])

    def __str__(self) -> str:
        return self.data.decode(errors="replace")


def _read_available(fd: int) -> bytes | None:
    """What a non-blocking pipe holds now: b"" at end of file, None when empty."""
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        except OSError:
            return b"".join(chunks)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
    return b"".join(chunks) or None


def describe_exit(process: BaseProcess) -> str:
    code = process.exitcode
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"exited with code {code} without reporting a result"
