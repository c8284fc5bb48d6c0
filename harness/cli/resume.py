"""``distdoctor resume-check SCRIPT``: does a run resumed from its own checkpoint train like
the same run never stopped? Three runs of the user's unchanged script on real ranks: once
stopped right after its K-th checkpoint is written (first: the step it was written after
bounds the others under --steps); once through; once more, resuming as the script
resumes. Each of the two trains in a fresh folder of its own (relative
checkpoint paths do not carry from one to the other; the user's own files are reachable
through links), and the step after the checkpoint on is compared (analysis/resume.py)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from distdoctor.cli.args import DEADLINE, UsageError, count, html_file, seconds


def add_commands(commands) -> None:
    check = commands.add_parser(
        "resume-check", help="check that your script, stopped after a checkpoint and "
                             "resumed, trains like one that never stopped",
        usage="distdoctor resume-check [OPTIONS] SCRIPT [ARGS...]\n"
              "       distdoctor resume-check [OPTIONS] -- COMMAND [ARGS...]",
        description="Run SCRIPT three times on N ranks: once stopped right after its K-th "
                    "checkpoint is written (torch.save or torch.distributed.checkpoint.save, "
                    "on any rank), as a crash would stop it; once through, in another fresh "
                    "folder; and once more from the first folder, so it resumes the way "
                    "your code resumes. Then compare the resumed run with the uninterrupted "
                    "one, step by step from the checkpoint on, on every rank: the "
                    "parameters, the "
                    "gradients, the optimiser's state and learning rate, the RNG states "
                    "(torch, numpy, random) and the sampler's epoch, bitwise. Name the first "
                    "thing that differs, on which ranks, and where it was saved and "
                    "restored. Exit 0 when the resume matches, 1 when it does not, 2 when it "
                    "cannot be checked (no K-th checkpoint, a run that failed, a checkpoint "
                    "outside the run's own folder). After --, run any COMMAND (torchrun "
                    "..., python train.py that spawns its ranks) the same three times; its "
                    "first process group is compared.")
    check.add_argument("--at", type=count(1), default=1, metavar="K",
                       help="stop after the K-th checkpoint is written (default 1)")
    check.add_argument("--steps", type=count(1), default=None, metavar="N",
                       help="compare N steps after the checkpoint, and stop the runs there "
                            "(default: run the script to its end)")
    check.add_argument("--nproc-per-node", type=count(1), default=2, metavar="N",
                       help="ranks to run (default 2)")
    check.add_argument("--deadline", type=seconds, default=60.0, metavar="SECONDS",
                       help=f"each run's deadline, as run's ({DEADLINE})")
    check.add_argument("--report", metavar="PATH", help="also write the verdict as JSON")
    check.add_argument("--html", type=html_file, metavar="PATH",
                       help="also write the verdict as one self-contained HTML page")
    check.add_argument("script", nargs="?", help="the training script, unchanged")
    check.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    check.set_defaults(handler=resume_check, launch_command=None)


def resume_check(args: argparse.Namespace) -> int:
    from distdoctor.analysis.resume import checkpoint_step, compare
    from distdoctor.models.events import Ev
    from distdoctor.trace.resume import LIMIT_ENV, MARK_ENV, RESUME_ENV, STOP_ENV

    home = Path.cwd()
    if args.launch_command is not None:
        if not args.launch_command:
            raise UsageError("give the COMMAND to run after --")
        if args.nproc_per_node != 2:
            raise UsageError("--nproc-per-node is for SCRIPT; with -- COMMAND the command's "
                             "own launcher starts the ranks")
        name = " ".join(args.launch_command)
        runs: Callable = lambda folder, env, expect_ok=True: _run_command(  # noqa: E731
            args.launch_command, args.deadline, folder, env, expect_ok)
    elif args.script is None:
        raise UsageError("give a SCRIPT, or -- and a COMMAND to run as is")
    else:
        script = Path(args.script).resolve()
        if not script.is_file():
            raise UsageError(f"no such script: {args.script}")
        name = script.name
        runs = lambda folder, env, expect_ok=True: _run(  # noqa: E731
            _in(script, home, folder), args, folder, env, expect_ok)
    if args.report and not Path(args.report).resolve().parent.is_dir():
        raise UsageError(f"--report {args.report}: no such folder to write it in")
    scratch = Path(tempfile.mkdtemp(prefix="distdoctor-resume-"))
    try:
        whole, stopped = scratch / "uninterrupted", scratch / "interrupted"
        for folder in (whole, stopped):
            _linked(home, folder)
        print(f"distdoctor resume-check: 1 of 3: {name}, stopped right after its "
              f"checkpoint #{args.at}, in a folder of its own ...", flush=True)
        mark = stopped / ".distdoctor-stop"
        interrupted = runs(stopped, {RESUME_ENV: "1", STOP_ENV: str(args.at),
                                     MARK_ENV: str(mark)}, expect_ok=False)
        step = checkpoint_step(interrupted, args.at)
        if step is None:
            raise UsageError(f"{name} wrote fewer than {args.at} checkpoints "
                             f"(torch.save, torch.distributed.checkpoint.save): nothing to "
                             f"resume from at --at {args.at}")
        _inside(interrupted, stopped)
        mark.unlink(missing_ok=True)
        limited = {LIMIT_ENV: str(step + args.steps)} if args.steps else {}
        print(f"distdoctor resume-check: 2 of 3: {name} once through"
              f"{f' to step {step + args.steps}' if args.steps else ''}, in another ...",
              flush=True)
        uninterrupted = runs(whole, {RESUME_ENV: "1", **limited})
        _inside(uninterrupted, whole)
        steps = max((e["step"] for trace in uninterrupted for e in trace
                     if e.get("ev") == Ev.STATE), default=0)
        if step >= steps:
            raise UsageError(f"checkpoint #{args.at} of {name} is written after its "
                             f"last step ({steps}): nothing after it to compare; give a "
                             f"smaller --at")
        print(f"distdoctor resume-check: 3 of 3: resumed in the first folder (checkpoint "
              f"#{args.at} was written after step {step}) ...", flush=True)
        resumed = runs(stopped, {RESUME_ENV: "1",
                                 **({LIMIT_ENV: str(args.steps)} if args.steps else {})})
        found = compare(uninterrupted, interrupted, resumed, step)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if found.kind == "not-deterministic":
        raise UsageError(f"cannot check {name}: {found.summary}; {found.fix}")
    verdict = "OK" if found.ok else "FAILED"
    named = "" if found.ok else f"{found.kind}: "  # the failure mode's one name
    print(f"distdoctor resume-check: {verdict}: {named}{found.summary}", flush=True)
    if found.fix:
        print(f"  fix: {found.fix}", flush=True)
    if args.report:
        Path(args.report).write_text(json.dumps({"status": verdict.lower(), **asdict(found)},
                                                indent=2) + "\n")
        print(f"\nwrote {args.report}", flush=True)
    if args.html:
        from distdoctor.pictures import page
        from distdoctor.pictures.resume import resume_page

        page.write(args.html, resume_page(found, name))
        print(f"\nwrote {args.html}", flush=True)
    return 0 if found.ok else 1


def _run(script: Path, args: argparse.Namespace, folder: Path, env: dict[str, str],
         expect_ok: bool = True) -> list[tuple[dict, ...]]:
    """One run of the script on real ranks, from ``folder`` (its TMPDIR there too), with
    the resume recorder on: each rank's trace. A run meant to finish that failed cannot be
    compared: said in one line."""
    from distdoctor.launch import procs
    from distdoctor.userjob.launching.launcher import ScriptStartError, run_script
    from distdoctor.userjob.reporting.record import explain, script_record

    with _inside_folder(folder, {**env, "TMPDIR": str(folder)}):
        try:
            result = run_script(str(script), args.args, args.nproc_per_node, args.deadline,
                                echo=False)
        except ScriptStartError as exc:
            raise UsageError(str(exc).splitlines()[0]) from None
        finally:
            procs.wait_reaped()
    if expect_ok and not result.ok:
        report = explain(script_record(result.ends, result.traces, result.wall_s,
                                       result.started, args.deadline), script.name)
        cause = report.cause
        raise UsageError(f"a run of {script.name} failed, so it cannot be compared: "
                         f"{cause.kind + ': ' + cause.summary if cause else 'it did not finish'}"
                         f" (distdoctor run {script.name} says more)")
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
            raise UsageError(str(exc)) from None
    try:
        if expect_ok and result.code != 0:
            raise UsageError(f"a run of '{' '.join(argv)}' failed (exit code {result.code}), "
                             f"so it cannot be compared (distdoctor run -- ... says why)")
        if not result.groups:
            raise UsageError(f"'{' '.join(argv)}' formed no process group under distdoctor: "
                             f"nothing to compare")
        try:
            job = load([str(result.groups[0])])
        except (TraceError, OSError) as exc:
            raise UsageError(f"cannot read the run's traces: {exc}") from None
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
                raise UsageError(
                    f"the checkpoint at {e.get('where')} is written to {e['path']}, outside "
                    f"the run's own folder (an absolute path, or a folder of yours): the "
                    f"three runs would share it. Give the script a relative checkpoint path "
                    f"in a folder it creates")
