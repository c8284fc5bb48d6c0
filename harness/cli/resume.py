"""``distdoctor resume-check SCRIPT``: does a run resumed from its own checkpoint train like
the same run never stopped? Three runs of the user's unchanged script on real ranks
(userjob/resuming/runs.py), said and written as text, JSON and HTML."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

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
    from distdoctor.userjob.resuming.runs import (
        CannotCompare,
        command_runs,
        resumption,
        script_runs,
    )

    home = Path.cwd()
    if args.launch_command is not None:
        if not args.launch_command:
            raise UsageError("give the COMMAND to run after --")
        if args.nproc_per_node != 2:
            raise UsageError("--nproc-per-node is for SCRIPT; with -- COMMAND the command's "
                             "own launcher starts the ranks")
        name = " ".join(args.launch_command)
        runs = command_runs(args.launch_command, args.deadline)
    elif args.script is None:
        raise UsageError("give a SCRIPT, or -- and a COMMAND to run as is")
    else:
        script = Path(args.script).resolve()
        if not script.is_file():
            raise UsageError(f"no such script: {args.script}")
        name = script.name
        runs = script_runs(script, args.args, args.nproc_per_node, args.deadline, home)
    if args.report and not Path(args.report).resolve().parent.is_dir():
        raise UsageError(f"--report {args.report}: no such folder to write it in")
    try:
        found = resumption(runs, name, home, args.at, args.steps, lambda said: print(
            f"distdoctor resume-check: {said}", flush=True))
    except CannotCompare as exc:
        raise UsageError(str(exc)) from None
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
