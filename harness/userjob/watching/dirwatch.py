"""Under torchrun, a deadlock proven from the trace files as the ranks write them.

Nobody watches a torchrun job from outside: each rank writes its calls to
``rank-<RANK>.jsonl`` in the trace directory and, alone, could only wait out its deadline.
So the lowest local rank of a node (LOCAL_RANK 0), whenever its own rank has made no call
for QUIET_S (it is blocked, or its peers are), reads every rank's trace from where it left
off and asks the same wait-for graph the parent asks under ``distdoctor run``
(analysis/waitfor.py: cycles, collectives that cannot pair, ranks waiting for ranks that
ended, a group whose calls already parted). A proof that has held for CONFIRM_S is written
to ``deadlock.json`` in the directory, with the run's id; every rank's stall watch, seeing
it, writes its stacks at once instead of at the deadline (and, with --exit-on-hang, ends),
and ``distdoctor analyze`` names the cause from the traces.

It needs every rank's trace in the one directory (one node, or a file system the nodes
share); where some are missing (each node writing its own), the deadline decides, as
before. Reading costs the watching rank only while it is idle, and only the bytes written
since its last look.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

from distdoctor.analysis.waitfor import Confirmation, Deadlock, WaitFor
from distdoctor.models.events import Ev
from distdoctor.trace.stalls import still_stalled_in

PROOF_FILE = "deadlock.json"
STALL_FILE = "stalled.json"  # distdoctor's call, from outside: the group's deadline passed
QUIET_S = 0.2  # the watching rank's own silence before it reads the others' traces
POLL_S = 0.1  # how often each rank's stall watch looks for a proof
# after the watching rank stalled, how long its peers' own watches have to say so before
# it asks for their stacks (a watch polls every POLL_S; one that cannot run in a second,
# its rank busy holding the GIL, will not)
POKE_AFTER_S = 1.0


class TraceDirectory:
    """Every rank's trace of one run, read as it grows, and the proof it holds."""

    def __init__(self, directory: str | Path, world: int, run: str):
        self.directory = Path(directory)
        self.run = run
        self.waitfor = WaitFor(range(world))
        self.offsets = dict.fromkeys(range(world), 0)
        self.confirm = Confirmation()

    def proof(self, now: float) -> Deadlock | None:
        """A deadlock that has held for CONFIRM_S, or None (yet)."""
        if not self._read():
            self.confirm.drop()
            return None
        found = self.waitfor.proof()
        seen = tuple(self.offsets.values())  # a byte more from any rank breaks it
        return found if self.confirm.offer(found, seen, now) and found else None

    def _read(self) -> bool:
        """Feed what each trace gained; False while some rank's trace of this run is not
        there (not started, another node's, or an earlier run's not yet overwritten)."""
        for rank, offset in self.offsets.items():
            try:
                with open(self.directory / f"rank-{rank}.jsonl", "rb") as trace:
                    trace.seek(offset)
                    chunk = trace.read()
            except OSError:
                return False
            if offset == 0 and not self._ours(chunk.partition(b"\n")[0]):
                return False
            if chunk:
                self.waitfor.feed(rank, chunk)
                self.offsets[rank] = offset + len(chunk)
        return True

    def trace_sizes(self) -> dict[int, int]:
        """How far each rank's trace has been written, to tell later which moved on."""
        sizes = {}
        for rank in self.offsets:
            try:
                sizes[rank] = os.path.getsize(self.directory / f"rank-{rank}.jsonl")
            except OSError:
                continue
        return sizes

    def poke_silent(self, own: int, sizes_before: dict[int, int]) -> list[int]:
        """Ask every rank of this run on this machine that is silent (its trace has not
        grown since ``sizes_before``), not stalled and not ended for its stacks (SIGUSR1:
        faulthandler writes them from its C handler, so a rank whose own watch cannot run,
        busy in code that holds the GIL, answers too). A rank still making calls is left
        alone: it is working, and a dump would show where it passed, not where it waits.
        The ranks poked, by pid. Called by the node's watching rank as it stalls."""
        host, poked = socket.gethostname(), []
        for rank in self.offsets:
            try:
                with open(self.directory / f"rank-{rank}.jsonl", "rb") as trace:
                    text = trace.read()
            except OSError:
                continue
            first = text.partition(b"\n")[0]
            if not self._ours(first) or still_stalled_in(text) or b'"ev":"exit"' in text \
                    or len(text) > sizes_before.get(rank, len(text)):
                continue
            start = json.loads(first)
            pid = start.get("pid")
            if start.get("host") != host or not isinstance(pid, int) or pid == own:
                continue
            try:
                os.kill(pid, signal.SIGUSR1)
                poked.append(pid)
            except OSError:
                pass  # gone already
        return poked

    def _ours(self, first: bytes) -> bool:
        """Is this the start line of this run's trace?"""
        try:
            start = json.loads(first)
        except ValueError:
            return False
        return isinstance(start, dict) and start.get("ev") == Ev.START \
            and start.get("run") == self.run


def write_proof(directory: str | Path, run: str, proof: Deadlock) -> None:
    """Say it once, atomically: a reader sees the whole file or none."""
    path = Path(directory) / PROOF_FILE
    scratch = path.with_name(f".{PROOF_FILE}.{os.getpid()}")
    scratch.write_text(json.dumps({"run": run, "kind": proof.kind, "ranks": list(proof.ranks),
                                   "text": proof.text}))
    os.replace(scratch, path)


def read_proof(directory: str | Path, run: str) -> str | None:
    """The proof's sentence, if one of this run's ranks wrote one."""
    try:
        said = json.loads((Path(directory) / PROOF_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(said, dict) or said.get("run") != run:
        return None  # an earlier run's
    text = said.get("text")
    return text if isinstance(text, str) else None


def call_stall(directory: str | Path, run: str, why: str) -> None:
    """Tell every rank of the run to write its stall now (``run -- COMMAND``'s deadline,
    kept by distdoctor for the whole group): atomically, as the proof."""
    path = Path(directory) / STALL_FILE
    scratch = path.with_name(f".{STALL_FILE}.{os.getpid()}")
    scratch.write_text(json.dumps({"run": run, "why": why}))
    os.replace(scratch, path)


def stall_called(directory: str | Path, run: str) -> bool:
    try:
        said = json.loads((Path(directory) / STALL_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(said, dict) and said.get("run") == run
