"""What the ranks print, passed through as torchrun passes it: whole lines, in order per rank.

Each rank's stdout and stderr come to the launcher on pipes of their own. Written straight
to one terminal, four ranks' prints splice mid-line (print writes its text and its newline
separately, and unbuffered ranks write each at once); here each line is written whole, with
one write, once its newline has come. A line still open when its rank ends is written with a
newline added. torchrun's own flags carry over: ``--tee`` puts ``[default0]:`` before each
line of the chosen streams (torchrun also tees them into log files; distdoctor keeps no
logs), and ``--local-ranks-filter`` shows only the chosen ranks' output.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

_BITS = {"stdout": 1, "stderr": 2}  # torchrun's Std: 1 stdout, 2 stderr, 3 both, 0 neither
_VALUE = re.compile(r"^[0-3]$")
_MAPPING = re.compile(r"^(\d+:[0-3],)*\d+:[0-3]$")


def parse_tee(text: str) -> dict[int, int] | int:
    """torchrun's ``--tee`` value: 0-3 for every rank, or ``RANK:VALUE,...`` per rank."""
    if _VALUE.match(text):
        return int(text)
    if _MAPPING.match(text):
        return {int(rank): int(value) for rank, value in
                (item.split(":") for item in text.split(","))}
    raise ValueError(f"expected 0 (none), 1 (stdout), 2 (stderr), 3 (both) or a per-rank "
                     f"mapping such as 0:3,1:1, got {text!r}")


def parse_ranks(text: str) -> frozenset[int]:
    """torchrun's ``--local-ranks-filter``: comma-separated local ranks."""
    try:
        ranks = frozenset(int(item) for item in text.split(","))
    except ValueError:
        raise ValueError(f"expected comma-separated ranks such as 0,1, got {text!r}") from None
    if any(rank < 0 for rank in ranks):
        raise ValueError(f"expected ranks 0 and up, got {text!r}")
    return ranks


@dataclass(frozen=True)
class OutputSpec:
    """How the ranks' lines reach the terminal: which streams are prefixed for which rank
    (torchrun's --tee), and which ranks are shown at all (None: every rank)."""

    tee: dict[int, int] | int = 0
    shown: frozenset[int] | None = None

    def prefixed(self, rank: int, stream: str) -> bool:
        bits = self.tee.get(rank, 0) if isinstance(self.tee, dict) else self.tee
        return bool(bits & _BITS[stream])

    def shows(self, rank: int) -> bool:
        return self.shown is None or rank in self.shown


@dataclass
class RankOutput:
    """The launcher's end of every rank's stdout and stderr: fed chunks as they arrive,
    writes complete lines to this process's own stdout and stderr."""

    spec: OutputSpec = OutputSpec()
    _open: dict[tuple[int, str], bytes] = field(default_factory=dict)

    def feed(self, rank: int, stream: str, chunk: bytes) -> None:
        data = self._open.pop((rank, stream), b"") + chunk
        whole, newline, rest = data.rpartition(b"\n")
        if rest:
            self._open[(rank, stream)] = rest
        if newline:
            self._write(rank, stream, whole + newline)

    def close(self) -> None:
        """Write the lines still open (a rank that ended mid-line), each with a newline."""
        for (rank, stream), rest in sorted(self._open.items()):
            self._write(rank, stream, rest + b"\n")
        self._open.clear()

    def _write(self, rank: int, stream: str, lines: bytes) -> None:
        if not self.spec.shows(rank):
            return
        if self.spec.prefixed(rank, stream):
            prefix = f"[default{rank}]:".encode()
            lines = b"".join(prefix + line for line in lines.splitlines(keepends=True))
        target = sys.stdout if stream == "stdout" else sys.stderr
        target.flush()  # what this process wrote first stays first
        buffer = getattr(target, "buffer", None)
        if buffer is not None:
            buffer.write(lines)
            buffer.flush()
        else:
            target.write(lines.decode(errors="replace"))
            target.flush()
