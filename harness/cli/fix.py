"""``distdoctor run --fix SCRIPT``: the report, then a patch for what an edit can cure,
verified by running the patched copy the same way before it is shown, saved or applied."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from distdoctor.cli.args import UsageError


def report_with_fixes(record, script: Path, args: argparse.Namespace) -> int:
    """The run's report as ``run`` prints it, then what --fix found: a verified diff, or
    why none is offered; the JSON report carries the same."""
    from distdoctor.cli.published import publish
    from distdoctor.fixing.patches import Finding, apply, propose, verify
    from distdoctor.userjob.reporting.record import explain
    from distdoctor.userjob.reporting.report import FixReport, render

    result = explain(record, args.script, args.all_frames)
    print(render(result, "run"), flush=True)
    findings = [Finding(c.kind, c.where, tuple(c.also_at)) for c in result.findings]
    if not findings:
        print("\ndistdoctor run --fix: nothing to fix", flush=True)
        return publish(record, result, "run", args.report, args.html)
    proposal, said = propose(findings, script, Path.cwd())
    for line in said:
        print(f"\ndistdoctor run --fix: {line}", flush=True)
    fixes, refused = [], ""
    if proposal is not None:
        print(f"\ndistdoctor run --fix: re-running a patched copy on {args.nproc_per_node} "
              f"ranks to verify it ...", flush=True)
        outcome = verify(proposal, args.script, lambda patched: _rerun(patched, args),
                         [f.kind for f in findings])
        applied = None
        if outcome.verified:
            print(f"distdoctor run --fix: verified, the patched copy reports {outcome.rerun}"
                  f" ({', '.join(proposal.cures)} gone, nothing new):\n\n{outcome.diff}",
                  flush=True)
            try:
                if args.patch:
                    Path(args.patch).write_text(outcome.diff)
                    print(f"wrote {args.patch}", flush=True)
                if args.apply:
                    applied = str(apply(proposal))
                    print(f"applied to {args.script} (the original is in {applied})",
                          flush=True)
            except OSError as exc:  # said in one line once the report is written
                refused = f"{exc.strerror}: {exc.filename}" if exc.strerror else str(exc)
        else:
            print(f"distdoctor run --fix: the edit for {', '.join(proposal.cures)} did not "
                  f"verify: the patched copy reports {outcome.rerun}; no patch is offered",
                  flush=True)
        fixes.append(FixReport(list(proposal.cures), outcome.verified, outcome.rerun,
                               outcome.diff if outcome.verified else "", applied))
    code = publish(record, dataclasses.replace(result, fixes=fixes), "run", args.report,
                   args.html)
    if refused:
        raise UsageError(f"the verified patch was not written: {refused}")
    return code


def _rerun(patched: Path, args: argparse.Namespace) -> tuple[str, list[str]]:
    """The patched copy run as the first run was (ranks, deadline, arguments, address),
    quietly: its verdict's first line and its causes' kinds."""
    from distdoctor.launch import procs
    from distdoctor.models.calls import ranks_phrase
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
    cause = report.cause
    verdict = "OK" if cause is None else f"FAILED: {cause.kind} ({ranks_phrase(cause.ranks)})"
    return verdict, [c.kind for c in report.findings]
