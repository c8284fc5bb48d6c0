"""Reading every rank's dump, on every core when there are many.

Reading is the whole cost at cluster scale (a 2000-entry dump takes about 8 ms to
unpickle and fold), so above ``PARALLEL_FROM`` files the reads are spread over one
process per core. Each worker sends back a history's entries the first time it meets its
signature, and only the signature after that: what crosses between processes is small.
Progress goes to ``progress`` (stderr), since 16,384 files take a while.
"""

from __future__ import annotations

import gc
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from distdoctor.dumps.files import DumpFile
from distdoctor.dumps.job import Dumps
from distdoctor.dumps.read import NotADump, RankRead, Shared, read
from distdoctor.dumps.schema import Entry
from distdoctor.models.calls import clipped
from distdoctor.models.plaindata import NotPlainData

PARALLEL_FROM = 256
MOST_CHARS = 160  # of an error quoted from a damaged dump
_CHUNK = 64
_known: dict[bytes, object] = {}  # a worker's signatures already sent, and their programs


class Refused(ValueError):
    """A file is not plain data: it would run code if unpickled. Nothing of it ran."""


@dataclass(frozen=True)
class Outcome:
    """One file's read: what it holds, or the line that says why not (``refused``: it is
    not plain data, which ends the whole analysis)."""

    read: RankRead | None
    shared: Shared | None
    note: str = ""
    refused: bool = False


def read_all(files: list[DumpFile], progress: TextIO | None | bool = True,
             workers: int | None = None) -> Dumps:
    """Every file read (Refused on the first that is not plain data); progress to
    ``progress`` (True: stderr as it is at the call)."""
    out = sys.stderr if progress is True else progress or None
    reads: dict[int, RankRead] = {}
    histories: dict[bytes, tuple[Entry, ...]] = {}
    members: dict[bytes, tuple[int, ...] | None] = {}
    notes: list[str] = []
    jobs = [(f.rank, str(f.path)) for f in files]
    workers = workers or min(os.cpu_count() or 1, 8)
    enabled = gc.isenabled()
    gc.disable()  # millions of small containers, none of them cyclic
    try:
        if len(jobs) < PARALLEL_FROM or workers == 1:
            known: dict[bytes, object] = {}
            outcomes = (_read_one(job, known) for job in jobs)
            _fold(outcomes, len(jobs), reads, histories, members, notes, out)
        else:
            chunks = [jobs[i:i + _CHUNK] for i in range(0, len(jobs), _CHUNK)]
            with ProcessPoolExecutor(workers, initializer=_fresh) as pool:
                outcomes = (o for chunk in pool.map(_read_chunk, chunks) for o in chunk)
                _fold(outcomes, len(jobs), reads, histories, members, notes, out)
    finally:
        if enabled:
            gc.enable()
    return Dumps(reads, histories, members, tuple(notes))


def _fold(outcomes, total: int, reads: dict, histories: dict, members: dict, notes: list,
          progress: TextIO | None) -> None:
    step = max(1, total // 10)
    for done, outcome in enumerate(outcomes, 1):
        if outcome.refused:
            raise Refused(outcome.note)
        if outcome.note:
            notes.append(outcome.note)
        if outcome.read is not None and outcome.shared is not None:
            reads[outcome.read.rank] = outcome.read
            histories.update(outcome.shared.histories)
            members.update(outcome.shared.members)
        if progress is not None and total >= PARALLEL_FROM and (done % step == 0
                                                              or done == total):
            print(f"distdoctor analyze: read {done} of {total} dumps", file=progress,
                  flush=True)


def _fresh() -> None:
    _known.clear()
    gc.disable()


def _read_chunk(chunk: list[tuple[int, str]]) -> list[Outcome]:
    return [_read_one(job, _known) for job in chunk]


def _read_one(job: tuple[int, str], known: dict[bytes, object]) -> Outcome:
    rank, path = job
    try:
        return Outcome(*read(Path(path), rank, known))
    except NotPlainData as exc:
        return Outcome(None, None, f"{path}: {exc}; nothing of it was run", refused=True)
    except NotADump as exc:
        return Outcome(None, None, f"{path}: {exc}; skipped")
    except OSError as exc:
        return Outcome(None, None, f"{path}: cannot be read ({exc.strerror or exc}); skipped")
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError,
            MemoryError) as exc:
        return Outcome(None, None, f"{path}: cut short or damaged ({_short(exc)}); its rank "
                                   f"is counted as having no dump")


def _short(exc: BaseException) -> str:
    return clipped(str(exc), MOST_CHARS)

