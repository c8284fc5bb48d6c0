"""The three runs of resume-check, on real ranks: once stopped right after its K-th
checkpoint is written (first: the step it was written after bounds the others under a
step limit); once through; once more, resuming as the script resumes. Each of the two
trains in a fresh folder of its own (relative checkpoint paths do not carry from one to the
other; the user's own files are reachable through links), and the step after the
checkpoint on is compared (analysis/resume.py). ``distdoctor resume-check`` and the
grading of a resume exercise both ask this."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Callable

from distdoctor.analysis.resume import Resumption, checkpoint_step, compare
from distdoctor.models.events import Ev
from distdoctor.trace.resume import LIMIT_ENV, MARK_ENV, RESUME_ENV, STOP_ENV

# one run: from a folder, with more environment, whether it must finish, and whether it is
# the run once through (the one a plain run of the script would be) -> each rank's trace
Runs = Callable[..., list[tuple[dict, ...]]]
# told what every detector finds in the run once through: whether each rank finished, and
# each cause (kind, summary), its lines said as the user's own files
Judge = Callable[[bool, tuple[tuple[str, str], ...]], None]


class CannotCompare(ValueError):
    """The runs cannot be compared (no K-th checkpoint, a run that failed, a checkpoint
    outside the run's own folder): said in one line."""


def resumption(runs: Runs, name: str, home: Path, at: int = 1, steps: int | None = None,
               progress: Callable[[str], None] = lambda said: None) -> Resumption:
    """The three runs of ``runs``, in fresh folders linked to ``home``, compared."""
    home = home.resolve()  # (the links must name it whatever the working directory)
    scratch = Path(tempfile.mkdtemp(prefix="distdoctor-resume-"))
    try:
        whole, stopped = scratch / "uninterrupted", scratch / "interrupted"
        for folder in (whole, stopped):
            _linked(home, folder)
        progress(f"1 of 3: {name}, stopped right after its checkpoint #{at}, in a folder "
                 f"of its own ...")
        mark = stopped / ".distdoctor-stop"
        interrupted = runs(stopped, {RESUME_ENV: "1", STOP_ENV: str(at),
                                     MARK_ENV: str(mark)}, expect_ok=False)
        step = checkpoint_step(interrupted, at)
        if step is None:
            raise CannotCompare(f"{name} wrote fewer than {at} checkpoints "
                                f"(torch.save, torch.distributed.checkpoint.save): nothing to "
                                f"resume from at --at {at}")
        _inside(interrupted, stopped)
        mark.unlink(missing_ok=True)
        limited = {LIMIT_ENV: str(step + steps)} if steps else {}
        progress(f"2 of 3: {name} once through"
                 f"{f' to step {step + steps}' if steps else ''}, in another ...")
        uninterrupted = runs(whole, {RESUME_ENV: "1", **limited}, once_through=True)
        _inside(uninterrupted, whole)
        last = max((e["step"] for trace in uninterrupted for e in trace
                    if e.get("ev") == Ev.STATE), default=0)
        if step >= last:
            raise CannotCompare(f"checkpoint #{at} of {name} is written after its "
                                f"last step ({last}): nothing after it to compare; give a "
                                f"smaller --at")
        progress(f"3 of 3: resumed in the first folder (checkpoint #{at} was written after "
                 f"step {step}) ...")
        resumed = runs(stopped, {RESUME_ENV: "1",
                                 **({LIMIT_ENV: str(steps)} if steps else {})})
        found = compare(uninterrupted, interrupted, resumed, step)
        return replace(found, summary=said_at_home(found.summary, (whole, stopped), home),
                       lines=tuple(said_at_home(line, (whole, stopped), home)
                                   for line in found.lines))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@contextmanager
def own_folder(home: Path):
    """A fresh folder, linked to ``home``'s entries, as the working directory (and TMPDIR)
    while a run writes its checkpoints there; removed after."""
    scratch = Path(tempfile.mkdtemp(prefix="distdoctor-resume-"))
    try:
        folder = scratch / "run"
        _linked(home.resolve(), folder)
        with _inside_folder(folder, {"TMPDIR": str(folder)}):
            yield folder
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def said_at_home(text: str, folders: tuple[Path, ...], home: Path) -> str:
    """A text said as the user's own files: a line outside the working directory is said
    through the run's folder, which is gone once the runs are compared."""
    for folder in folders:
        text = text.replace(f"{folder}/", f"{home}/")
    return text


def script_runs(script: Path, script_args: list[str], world_size: int, deadline: float,
                home: Path, judge: Judge | None = None) -> Runs:
    """Runs of ``script`` (its path under ``home`` taken through each run's folder).
    ``judge``, if given, is told what every detector finds in the run once through: it
    is a plain run of the script too, so a grader needs no fourth run."""
    def run(folder: Path, env: dict[str, str], expect_ok: bool = True,
            once_through: bool = False) -> list[tuple[dict, ...]]:
        def judged(finished: bool, causes: tuple[tuple[str, str], ...]) -> None:
            assert judge is not None
            judge(finished, tuple((kind, said_at_home(said, (folder,), home))
                                  for kind, said in causes))

        return _run(_in(script, home, folder), script_args, world_size, deadline, folder, env,
                    expect_ok, judged if judge is not None and once_through else None)

    return run


def command_runs(argv: list[str], deadline: float) -> Runs:
    """Runs of any command that starts its ranks itself (torchrun, mp.spawn)."""
    return lambda folder, env, expect_ok=True, once_through=False: _run_command(  # noqa: E731
        argv, deadline, folder, env, expect_ok)


def _run(script: Path, script_args: list[str], world_size: int, deadline: float,
         folder: Path, env: dict[str, str], expect_ok: bool = True,
         judge: Judge | None = None) -> list[tuple[dict, ...]]:
    """One run of the script on real ranks, from ``folder`` (its TMPDIR there too), with
    the resume recorder on: each rank's trace, and what every detector finds told to
    ``judge``. A run meant to finish that failed cannot be compared: said in one line."""
    from distdoctor.launch import procs
    from distdoctor.userjob.launching.launcher import ScriptStartError, run_script
    from distdoctor.userjob.reporting.record import explain, script_record

    with _inside_folder(folder, {**env, "TMPDIR": str(folder)}):
        try:
            result = run_script(str(script), script_args, world_size, deadline, echo=False)
        except ScriptStartError as exc:
            raise CannotCompare(str(exc).splitlines()[0]) from None
        finally:
            procs.wait_reaped()
    record = script_record(result.ends, result.traces, result.wall_s, result.started, deadline)
    if judge is not None:  # as ``distdoctor run`` would say it
        judge(all(end.status == "finished" for end in result.ends),
              tuple((c.kind, c.summary) for c in explain(record, str(script)).findings))
    if expect_ok and not result.ok:
        cause = explain(record, script.name).cause
        # how each rank that did not finish ended, the cause's evidence said plainly (a
        # rank that died of a signal reads as its peer having left early)
        ended = "; ".join(f"rank {end.rank} {end.status}: {end.headline}"
                          for end in result.ends if not end.ok)
        raise CannotCompare(f"a run of {script.name} failed, so it cannot be compared: "
                            f"{cause.kind + ': ' + cause.summary if cause else 'it did not finish'}"
                            f" ({ended}; distdoctor run {script.name} says more)")
    return [tuple(trace) for trace in result.traces]


def _run_command(argv: list[str], deadline: float, folder: Path, env: dict[str, str],
                 expect_ok: bool = True) -> list[tuple[dict, ...]]:
    """One run of the command, quiet, from ``folder``: its first process group's traces
    (each rank's, by its rank). A run meant to finish that failed cannot be compared."""
    from distdoctor.userjob.launching.command import CommandStartError, run_command
    from distdoctor.userjob.reporting.traces import TraceError, load

    with _inside_folder(folder, {**env, "TMPDIR": str(folder)}):
        try:
            result = run_command(argv, deadline, quiet=True)
        except CommandStartError as exc:
            raise CannotCompare(str(exc)) from None
    try:
        if expect_ok and result.code != 0:
            raise CannotCompare(f"a run of '{' '.join(argv)}' failed (exit code {result.code}), "
                                f"so it cannot be compared (distdoctor run -- ... says why)")
        if not result.groups:
            raise CannotCompare(f"'{' '.join(argv)}' formed no process group under distdoctor: "
                                f"nothing to compare")
        try:
            job = load([str(result.groups[0])])
        except (TraceError, OSError) as exc:
            raise CannotCompare(f"cannot read the run's traces: {exc}") from None
        return [tuple(trace) for trace in job.events]
    finally:
        shutil.rmtree(result.root, ignore_errors=True)


def _in(script: Path, home: Path, folder: Path) -> Path:
    """The script as the run's folder reaches it (through its link, so a path the script
    makes from its own ``__file__`` is in the run's folder), where it is under ``home``."""
    return folder / script.relative_to(home) if script.is_relative_to(home) else script


@contextmanager
def _inside_folder(folder: Path, env: dict[str, str]):
    """The ranks start from ``folder`` with ``env`` (they inherit this process's working
    directory and environment); both restored after."""
    home, before = Path.cwd(), {name: os.environ.get(name) for name in env}
    cached = tempfile.tempdir  # (forked ranks would inherit it, not read TMPDIR)
    os.chdir(folder)
    os.environ.update(env)
    tempfile.tempdir = None
    try:
        yield
    finally:
        os.chdir(home)
        tempfile.tempdir = cached
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _linked(home: Path, folder: Path) -> None:
    """A fresh folder whose entries link to the user's working directory's: relative reads
    reach the user's files; new files (a checkpoint) are the run's own."""
    folder.mkdir()
    for entry in home.iterdir():
        (folder / entry.name).symlink_to(entry)


def _inside(traces: list[tuple[dict, ...]], folder: Path) -> None:
    """Every checkpoint written in the run's own folder: one written elsewhere (an
    absolute path, or a folder that links to the user's) would be shared by the runs."""
    from distdoctor.models.events import Ev

    own = folder.resolve()
    for trace in traces:
        for e in trace:
            if e.get("ev") != Ev.SAVE or not e.get("path"):
                continue
            path = folder / e["path"]  # (an absolute path stays itself)
            if not (path.parent.resolve() / path.name).is_relative_to(own):
                raise CannotCompare(
                    f"the checkpoint at {e.get('where')} is written to {e['path']}, outside "
                    f"the run's own folder (an absolute path, or a folder of yours): the "
                    f"three runs would share it. Give the script a relative checkpoint path "
                    f"in a folder it creates")
