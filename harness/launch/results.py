"""What one job on N ranks came to: every rank's end, value and records, and the root cause."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from distdoctor.models import RankEnd
from distdoctor.models.record import CRASHED, is_peer_echo


class RanksFailed(RuntimeError):
    """A job did not finish on every rank; the message is the diagnosis."""

    def __init__(self, result: JobResult):
        super().__init__(result.summary())
        self.result = result


@dataclass(frozen=True)
class JobResult:
    """Each rank's end, return value and streamed records for one job."""

    ends: tuple[RankEnd, ...]
    values: tuple[Any, ...]  # None where the rank did not finish
    events: tuple[tuple[Any, ...], ...]  # what each rank emitted, in order
    wall_s: float
    traces: tuple[tuple[dict, ...], ...] = ()  # each rank's tracer events (JSON objects)
    started: float = 0.0  # when the job was sent, on the machine-wide monotonic clock

    @property
    def ok(self) -> bool:
        return all(end.ok for end in self.ends)

    @property
    def root_cause(self) -> RankEnd | None:
        """The first rank to raise or die, not counting gloo's echoes of a peer's failure.

        A death is only noticed when the parent next looks, so a peer's "Connection reset
        by peer" can carry an earlier time than the death that caused it.
        """
        failed = [e for e in self.ends if e.status in CRASHED]
        primary = [e for e in failed if not is_peer_echo(e)] or failed
        return min(primary, key=lambda e: e.at if e.at is not None else float("inf"),
                   default=None)

    def raise_for_status(self) -> JobResult:
        if not self.ok:
            raise RanksFailed(self)
        return self

    def summary(self) -> str:
        if self.ok:
            return f"all {len(self.ends)} ranks finished in {self.wall_s:.3f} s"
        lines = []
        root = self.root_cause
        if root is not None:
            lines.append(f"rank {root.rank} {root.status} first (root cause):\n{root.error}")
        for end in self.ends:
            if end is root or end.ok:
                continue
            where = ""
            if end.stacks and end.stacks[0].frames:
                frame = end.stacks[0].frames[-1]
                where = f" in {frame.function} at {frame.place}"
            lines.append(f"rank {end.rank} {end.status}{where}"
                         + (f": {end.headline}" if end.error else ""))
        return "\n".join(lines)
