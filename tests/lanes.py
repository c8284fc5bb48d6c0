"""Background lanes: every job of the suite that only starts fresh interpreters (torchrun
jobs, the CLI as a user starts it, the benches' smoke runs) is registered once, run once
per session by a runner process of its own, two at a time, while the in-process tests run,
and read by the tests that need it.

Why: most of such a job's seconds go to interpreters importing torch, one core each, while
many in-process tests leave a core idle (waiting on ranks, on deadlines, on pipes). Run
here, the jobs fill those gaps; the tests that read them are ordered last (conftest.py),
so by the time they ask, most results are on disk.

A test module registers jobs with a module-level ``lane_jobs(root: Path) -> list[Job]``
(``root`` is a fresh directory for its jobs' files) and reads them through the ``lanes``
fixture: ``lanes.result(name)``. The runner is ``python tests/lanes.py``: jobs on stdin
(one JSON line), each finished job's result written to ``ROOT/<n>.json`` and its number
printed; stdin closing (the suite ended, or was killed) stops every job still running.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import proctable

LANES = 2  # jobs at a time: one per core here; each job's ranks share them with the tests


@dataclass(frozen=True)
class Step:
    """One command of a job, run to its end before the next starts."""

    name: str
    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str] = field(default_factory=dict)  # over the suite's own environment
    timeout: float = 150.0
    # run again (up to ``tries`` runs in all) when it failed with this in its stderr
    retry_on: str | None = None
    tries: int = 1


@dataclass(frozen=True)
class Job:
    name: str
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class StepResult:
    returncode: int | None  # None: stopped at its timeout
    stdout: str
    stderr: str
    retries: int = 0  # runs repeated for ``retry_on``
    seconds: float = 0.0  # wall time, every run of it


class Lanes:
    """The pytest side: starts the runner with every job, and hands out results."""

    def __init__(self, jobs: list[Job], root: Path):
        names = [job.name for job in jobs]
        assert len(set(names)) == len(names), "job names must be unique"
        self.root = root
        self._jobs = {job.name: job for job in jobs}
        self._index = {job.name: i for i, job in enumerate(jobs)}
        self._done: set[int] = set()
        self._partial = b""  # the runner's output after its last whole line
        self.runner = subprocess.Popen(
            [sys.executable, __file__, str(root)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, start_new_session=True)
        assert self.runner.stdin is not None
        self.runner.stdin.write(json.dumps([asdict(job) for job in jobs]).encode() + b"\n")
        self.runner.stdin.flush()

    def job(self, name: str) -> Job:
        """The job as registered (its steps' commands and folders)."""
        return self._jobs[name]

    def result(self, name: str, timeout: float = 900.0) -> dict[str, StepResult]:
        """The job's steps' results, by step name; waits for the job to end."""
        index = self._index[name]
        end = time.monotonic() + timeout
        assert self.runner.stdout is not None
        fd = self.runner.stdout.fileno()  # read raw: a buffered reader would hide lines
        while index not in self._done:  # from select
            ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
            chunk = os.read(fd, 4096) if ready else b""
            if not chunk:
                raise AssertionError(f"lane job {name} did not end within {timeout:g} s"
                                     if not ready else "the lane runner died")
            *lines, self._partial = (self._partial + chunk).split(b"\n")
            self._done.update(int(line) for line in lines)
        data = json.loads((self.root / f"{index}.json").read_text())
        return {step: StepResult(**result) for step, result in data.items()}

    def slowest(self, count: int) -> list[tuple[float, str]]:
        """(seconds, name) of the slowest jobs ended so far, slowest first."""
        timed = []
        for name, index in self._index.items():
            path = self.root / f"{index}.json"
            if index in self._done and path.exists():
                steps = json.loads(path.read_text()).values()
                timed.append((sum(step["seconds"] for step in steps), name))
        return sorted(timed, reverse=True)[:count]

    def close(self) -> None:
        """Stop every job still running and remove the jobs' files."""
        if self.runner.stdin is not None:
            self.runner.stdin.close()
        try:
            self.runner.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.runner.pid, signal.SIGKILL)
            self.runner.wait()
        if self.runner.stdout is not None:
            self.runner.stdout.close()
        shutil.rmtree(self.root, ignore_errors=True)


# -- the runner process ------------------------------------------------------------------

_running: dict[subprocess.Popen, str] = {}  # each step's process and its tag
_lock = threading.Lock()
_stopping = threading.Event()


def _run_step(step: dict) -> StepResult:
    retries, began = 0, time.monotonic()
    while True:
        tag = uuid.uuid4().hex  # every process the step starts inherits it
        with _lock:  # no job starts once the runner is stopping
            if _stopping.is_set():
                return StepResult(None, "", "(lanes: the suite ended first)", retries)
            process = subprocess.Popen(step["argv"], cwd=step["cwd"], text=True,
                                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, start_new_session=True,
                                       env=dict(os.environ, **step["env"],
                                                DISTDOCTOR_TEST_TAG=tag))
            _running[process] = tag
        try:
            out, err = process.communicate(timeout=step["timeout"])
            code: int | None = process.returncode
        except subprocess.TimeoutExpired:
            _kill(tag)  # torchrun's ranks, in sessions of their own, hold the pipes too
            out, err = process.communicate()
            code, err = None, err + f"\n(lanes: stopped at its {step['timeout']:g} s timeout)"
        finally:
            with _lock:
                _running.pop(process, None)
        retry = step["retry_on"] is not None and code != 0 and step["retry_on"] in err
        if not retry or retries + 1 >= step["tries"]:
            return StepResult(code, out, err, retries, time.monotonic() - began)
        retries += 1


def _run_job(root: Path, index: int, job: dict) -> None:
    results = {step["name"]: asdict(_run_step(step)) for step in job["steps"]}
    path = root / f"{index}.json"
    path.with_suffix(".tmp").write_text(json.dumps(results))
    path.with_suffix(".tmp").replace(path)
    with _lock:
        print(index, flush=True)


def _kill(tag: str) -> None:
    """Every live process of a step, wherever it was reparented."""
    for pid in proctable.tagged(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _stop_all() -> None:
    with _lock:
        _stopping.set()
        for tag in _running.values():
            _kill(tag)


def _serve(root: Path) -> None:
    jobs = json.loads(sys.stdin.readline())
    lanes = ThreadPoolExecutor(LANES)
    for index, job in enumerate(jobs):
        lanes.submit(_run_job, root, index, job)
    sys.stdin.read()  # returns when the suite closes our stdin, or dies
    _stop_all()
    lanes.shutdown(wait=False, cancel_futures=True)
    os._exit(0)


if __name__ == "__main__":  # in a session of its own: a terminal's Ctrl-C is the suite's
    _serve(Path(sys.argv[1]))
