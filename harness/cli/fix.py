"""``distdoctor run --fix``: the report, then a patch for what an edit can cure, verified
by running the patched copy the same way before it is shown, saved or applied. The same
for both forms: ``run --fix SCRIPT`` re-runs the copy on as many ranks; ``run --fix --
COMMAND`` re-runs the same command with the patched copy in place of the file it names."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
from pathlib import Path
from typing import Callable

from distdoctor.cli.args import UsageError

# what a re-run gives back: its verdict's first line, and its causes' kinds
Rerun = Callable[[Path], "tuple[str, list[str]]"]
# a re-run's kinds that no check names: the patched command failed in a way no report
# explains (no group formed, an exit code of its own), so the patch is not verified
NO_GROUP, COMMAND_FAILED = "no-process-group", "command-failed"


def report_with_fixes(record, script: Path, args: argparse.Namespace) -> int:
    """``run --fix SCRIPT``: the run's report as ``run`` prints it, then what --fix found."""
    from distdoctor.cli.published import publish
    from distdoctor.userjob.reporting.record import explain
    from distdoctor.userjob.reporting.report import render

    result = explain(record, args.script, args.all_frames)
    print(render(result, "run"), flush=True)
    fixes, refused = fix_findings(result, script, args.script,
                                  lambda patched: _rerun(patched, args), args)
    code = publish(record, dataclasses.replace(result, fixes=fixes), "run", args.report,
                   args.html)
    if refused:
        raise UsageError(f"the verified patch was not written: {refused}")
    return code


def command_fixes(result, argv: list[str], args: argparse.Namespace):
    """``run --fix -- COMMAND``: the fixes for the report chosen among the command's
    groups (the hung one, or the first that failed), and why none where none. The file
    patched is the one the first curable cause names; the command must name it (``torchrun
    ... train.py``) for its patched copy to be run the same way."""
    from distdoctor.fixing.patches import Finding, target

    script = target([Finding.of(c) for c in result.findings], Path.cwd())
    if script is None:  # (no cause a remedy may cure: each said why)
        return fix_findings(result, None, "", lambda patched: ("", []), args)
    if not any(_names(arg, script) for arg in argv[1:]):
        print(f"\ndistdoctor run --fix: the command does not name {_shown(script)}, so a "
              f"patched copy of it cannot be run the same way: no patch is offered (name "
              f"the script in the command, or use run --fix SCRIPT)", flush=True)
        return [], ""
    return fix_findings(result, script, _shown(script),
                        lambda patched: _rerun_command(argv, script, patched, args), args)


def fix_findings(result, script: Path | None, name: str, rerun: Rerun,
                 args: argparse.Namespace):
    """What --fix found for a report's causes: a verified diff, or why none is offered,
    printed; the patch saved (--patch) and applied (--apply) only once verified. The
    fixes for the JSON report, and why a verified patch could not be written, if so."""
    from distdoctor.fixing.patches import Finding, apply, propose, verify
    from distdoctor.userjob.reporting.report import FixReport

    findings = [Finding.of(c) for c in result.findings]
    if not findings:
        print("\ndistdoctor run --fix: nothing to fix", flush=True)
        return [], ""
    proposal, said = propose(findings, script, Path.cwd())
    for line in said:
        print(f"\ndistdoctor run --fix: {line}", flush=True)
    if proposal is None:
        return [], ""
    print("\ndistdoctor run --fix: re-running a patched copy the same way to verify it ...",
          flush=True)
    before = [f.kind for f in findings]
    outcome = verify(proposal, name, timing_confirmed(rerun, before), before)
    applied, refused = None, ""
    if outcome.verified:
        still = "" if outcome.rerun == "OK" else \
            " (what it still reports, this patch does not cure: see the report's fix)"
        print(f"distdoctor run --fix: verified, the patched copy reports {outcome.rerun}"
              f" ({', '.join(proposal.cures)} gone, nothing new){still}:\n\n{outcome.diff}",
              flush=True)
        try:
            if args.patch:
                Path(args.patch).write_text(outcome.diff)
                print(f"wrote {args.patch}", flush=True)
            if args.apply:
                applied = str(apply(proposal))
                print(f"applied to {name} (the original is in {applied})", flush=True)
        except OSError as exc:  # said in one line once the report is written
            refused = f"{exc.strerror}: {exc.filename}" if exc.strerror else str(exc)
    else:
        print(f"distdoctor run --fix: the edit for {', '.join(proposal.cures)} did not "
              f"verify: the patched copy reports {outcome.rerun}; no patch is offered",
              flush=True)
    return [FixReport(list(proposal.cures), outcome.verified, outcome.rerun,
                      outcome.diff if outcome.verified else "", applied)], refused


def timing_confirmed(rerun: Rerun, before: list[str]) -> Rerun:
    """``rerun``, run again while it raises a timing cause the first run did not (a
    straggler) and the reruns' vote has not settled (``analysis.votes``): one run's steps
    share their luck on a loaded machine (the suite under a busy loop on every core once
    saw a fix's healthy rerun called a straggler), so such a cause stands only once a
    second rerun raises it too, as in the fault loop and the exercises' grader."""
    from distdoctor import checks
    from distdoctor.analysis.votes import until_settled

    def new_timing(done: tuple[str, list[str]]) -> tuple[str, ...]:
        return tuple(k for k in done[1] if checks.judges_time(k) and k not in before)

    def confirmed(patched: Path) -> tuple[str, list[str]]:
        return until_settled(lambda _: rerun(patched), new_timing)[0]

    return confirmed


def _rerun(patched: Path, args: argparse.Namespace) -> tuple[str, list[str]]:
    """The patched copy run as the first run was (ranks, deadline, arguments, address),
    quietly: its verdict's first line and its causes' kinds."""
    from distdoctor.launch import procs
    from distdoctor.userjob.launching.launcher import run_script
    from distdoctor.userjob.reporting.record import explain, script_record

    try:
        again = run_script(str(patched), args.args, args.nproc_per_node, args.deadline,
                           echo=False, host=args.master_addr, light=args.light,
                           start_method=args.start_method)
    finally:
        procs.wait_reaped()
    report = explain(script_record(again.ends, again.traces, again.wall_s, again.started,
                                   args.deadline), str(patched))
    return _verdict(report), [c.kind for c in report.findings]


def _rerun_command(argv: list[str], script: Path, patched: Path,
                   args: argparse.Namespace) -> tuple[str, list[str]]:
    """The same command with the patched copy in place of the script it names, run as
    ``run -- COMMAND`` runs it: every group's causes, and the first failed group's
    verdict (a command that formed no group, or failed with no cause, is not OK)."""
    from distdoctor.userjob.launching.command import CommandStartError, run_command
    from distdoctor.userjob.reporting.groups import UnreadableGroup, group_reports

    swapped = [str(patched) if index and _names(arg, script) else arg
               for index, arg in enumerate(argv)]
    try:
        result = run_command(swapped, args.deadline, light=args.light, quiet=True)
    except CommandStartError as exc:
        return f"FAILED: {exc}", [COMMAND_FAILED]
    try:
        if result.unformed is not None:
            return f"FAILED: {result.unformed.kind}", [result.unformed.kind]
        if not result.groups:
            return f"FAILED: no process group formed (exit code {result.code})", [NO_GROUP]
        verdict, kinds = "OK", list[str]()
        for group in group_reports(result.groups, " ".join(swapped), args.deadline):
            if isinstance(group, UnreadableGroup):
                return f"FAILED: its traces cannot be read ({group.reason})", [COMMAND_FAILED]
            kinds += [c.kind for c in group.report.findings]
            verdict = _verdict(group.report) if verdict == "OK" else verdict
        if verdict == "OK" and result.code != 0:
            return f"FAILED: the command exited with code {result.code}", [COMMAND_FAILED]
        return verdict, kinds
    finally:
        shutil.rmtree(result.root, ignore_errors=True)


def _verdict(report) -> str:
    from distdoctor.models.calls import ranks_phrase

    cause = report.cause
    return "OK" if cause is None else f"FAILED: {cause.kind} ({ranks_phrase(cause.ranks)})"


def _names(arg: str, script: Path) -> bool:
    """Whether a command's argument is the script's path (as the user wrote it: relative
    to the working directory, or absolute)."""
    if not arg.endswith(".py") or "\0" in arg:
        return False
    try:
        return (Path.cwd() / arg).resolve() == script
    except (OSError, RuntimeError):  # (a path that cannot be resolved names no script)
        return False


def _shown(script: Path) -> str:
    """The script as the report names it: relative to the working directory when under it."""
    try:
        return os.path.relpath(script)
    except ValueError:
        return str(script)
