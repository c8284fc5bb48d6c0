"""Which files are Flight Recorder dumps, and whose.

torch names a rank's dump ``<TORCH_FR_DUMP_TEMP_FILE><rank>`` (by default
``~/.cache/fr_trace/nccl_trace_rank_<rank>``); a cluster's dumps come back as one folder
per node. A file is taken when its name ends in its rank (or ``<rank>.json`` /
``<rank>.pkl``) and it opens as a pickle or a JSON object naming a dump's fields; with a
prefix, only names that start with it. Our own traces (``rank-N.jsonl``) are not dumps.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

DUMP_PREFIX = "frdump_rank_"  # the dump a traced rank writes beside its trace, as torch's
_NAME = re.compile(r"(.*?)(\d+)(\.json|\.pkl|\.pickle)?")
_HEAD = 512  # bytes read to tell a dump by its content
_FIELDS = (b"version", b"entries", b"pg_config")


class NoDumps(ValueError):
    """The directories hold no dump (the message says what they hold)."""


@dataclass(frozen=True)
class DumpFile:
    rank: int
    path: Path


def find(directories: list[str], prefix: str | None = None) -> tuple[list[DumpFile], list[str]]:
    """Every dump under ``directories`` (searched to any depth), and notes: two files
    that claim one rank (the first by path is read)."""
    found: dict[int, DumpFile] = {}
    notes = []
    for directory in directories:
        if not os.path.isdir(directory):
            raise NoDumps(f"{directory} is not a directory")
        for root, _, names in sorted(os.walk(directory)):
            for name in sorted(names):
                rank = _rank_of(name, prefix)
                path = Path(root, name)
                if rank is None or not (prefix or _looks_like_dump(path)):
                    continue
                if rank in found:
                    notes.append(f"{path} and {found[rank].path} both hold rank {rank}; "
                                 f"read {found[rank].path}")
                    continue
                found[rank] = DumpFile(rank, path)
    return [found[r] for r in sorted(found)], notes


def _rank_of(name: str, prefix: str | None) -> int | None:
    if prefix is not None and not name.startswith(prefix):
        return None
    if name.endswith(".jsonl") or name.startswith("rank-"):
        return None  # a trace of ours, read as such
    match = _NAME.fullmatch(name[len(prefix or ""):] if prefix else name)
    return int(match[2]) if match and (prefix is None or match[1] == "") else None


def _looks_like_dump(path: Path) -> bool:
    """A pickle (protocol 2 and later open with 0x80) or JSON object whose head names a
    dump's fields; torch writes "version" first."""
    try:
        with open(path, "rb") as file:
            head = file.read(_HEAD)
    except OSError:
        return False
    if not head or head[:1] not in (b"\x80", b"{"):
        return False
    return any(field in head for field in _FIELDS)
