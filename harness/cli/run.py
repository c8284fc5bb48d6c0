"""``distdoctor run SCRIPT`` and ``distdoctor analyze DIR``: diagnose a user's own script."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from distdoctor.cli.args import (
    DEADLINE,
    UsageError,
    count,
    html_file,
    seconds,
    size_in_bytes,
)

MAX_PORT = 65535


def port_number(text: str) -> int:
    """A TCP port, 0 to MAX_PORT (0: the OS picks one)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"port {port} is outside 0-{MAX_PORT}")
    return port


def _tee(text: str):
    from distdoctor.userjob.launching.output import parse_tee

    try:
        return parse_tee(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ranks(text: str) -> frozenset[int]:
    from distdoctor.userjob.launching.output import parse_ranks

    try:
        return parse_ranks(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


ALL_FRAMES = ("show every frame and thread of a stopped rank (torch's, Python's and "
              "distdoctor's too); by default only your own code's frames, each thread once")


HTML = ("also write the report as one self-contained HTML page: the verdict, a hang's "
        "wait-for graph and each rank's calls on a timeline (no network needed to view it)")


def add_commands(commands) -> None:
    run = commands.add_parser(
        "run", help="run your own distributed script on N ranks (or any launch command) "
                    "and diagnose it",
        usage="distdoctor run [OPTIONS] SCRIPT [ARGS...]\n"
              "       distdoctor run [OPTIONS] -- COMMAND [ARGS...]",
        description="Start SCRIPT on N ranks as 'torchrun --standalone' would (RANK, "
                    "LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT set; "
                    "the script calls init_process_group itself), trace every collective and "
                    "point-to-point call, and when the ranks crash, disagree, deadlock or stop "
                    "making calls for --deadline seconds, say which rank did what, where, and "
                    "the fix. Or, after --, run any COMMAND as is (python train.py that "
                    "starts its ranks with mp.spawn or multiprocessing, torchrun ..., "
                    "accelerate launch ..., a shell script): every Python process of it that "
                    "calls init_process_group is traced the same way, numbered by its rank, "
                    "each process group apart; the command's output is its own, and its exit "
                    "code is given in the report. Exit 0 when the run is clean, 1 when a "
                    "problem was found (or the command failed).")
    run.add_argument("--nproc-per-node", type=count(1), default=2, metavar="N",
                     help="ranks to start (default: %(default)s)")
    run.add_argument("--deadline", type=seconds, default=DEADLINE, metavar="SECONDS",
                     help="seconds without a collective or point-to-point call, on any rank, "
                          "before the ranks count as hung (default: %(default)g). A deadlock "
                          "the calls prove (a cycle of sends or receives, different "
                          "collectives at one point, a wait on a rank that finished) is "
                          "reported within a fraction of a second, whatever this is; the "
                          "deadline is for what they cannot prove, like a rank spinning")
    run.add_argument("--report", metavar="PATH", help="also write the report as JSON "
                     "(schema distdoctor.run.v6)")
    run.add_argument("--light", action="store_true",
                     help="trace only the collective and point-to-point calls (hangs, crashes, "
                          "mismatches, unused DDP parameters), not the evidence of the silent "
                          "bugs (gradients, batches, NaN/Inf), which costs a few per cent of "
                          "a step")
    run.add_argument("--memory-budget", type=size_in_bytes, metavar="SIZE",
                     help="the training state each rank may hold (parameters, gradients, "
                          "optimiser state), as a device's memory would allow: 6MB, 80GB, "
                          "512MiB. Measured after the first optimiser steps; a rank over it "
                          "is reported as over-memory-budget, with the ZeRO stage "
                          "(ZeroRedundancyOptimizer, fully_shard) or the ranks that fit. "
                          "Not set: not measured")
    run.add_argument("--start-method", choices=("auto", "fork", "spawn"), default="auto",
                     help="how each rank starts: 'spawn', a fresh Python as torchrun starts "
                          "one; 'fork', a copy of this process, which has imported torch "
                          "already (seconds sooner per rank; environment, streams, signals "
                          "and random generators made fresh); 'auto' (default) forks unless "
                          "that would differ from a fresh rank (CUDA in use here, "
                          "OMP_NUM_THREADS above 1)")
    run.add_argument("--master-addr", default="127.0.0.1", metavar="HOST",
                     help="the address the rendezvous store listens on and the ranks connect "
                          "to (default: %(default)s, this machine only). Another address "
                          "opens the store, which has no authentication, to whoever can "
                          "reach it; name one only on a network you trust")
    run.add_argument("--master-port", type=port_number, default=0, metavar="PORT",
                     help="the store's port (default: 0, a free one the OS picks)")
    run.add_argument("--tee", "-t", type=_tee, default=0, metavar="STD",
                     help="as torchrun's --tee: put [default<rank>]: before each line of "
                          "the ranks' stdout (1), stderr (2) or both (3); 0 (default) "
                          "prints them bare. A mapping such as 0:3,1:1 sets it per rank. "
                          "Either way each rank's lines arrive whole and in order (torchrun "
                          "also writes log files; distdoctor does not)")
    run.add_argument("--local-ranks-filter", "--local_ranks_filter", type=_ranks,
                     default=None, metavar="RANKS",
                     help="as torchrun's: show only these ranks' output, e.g. 0 or 0,2 "
                          "(the diagnosis still reads every rank)")
    run.add_argument("--all-frames", action="store_true", help=ALL_FRAMES)
    run.add_argument("--html", type=html_file, metavar="PATH", help=HTML)
    run.add_argument("--fix", action="store_true",
                     help="after the verdict, patch the script for each cause whose remedy "
                          "is an edit of its lines (a sum not averaged, a sampler never told "
                          "the epoch, ...), run the patched copy the same way in a "
                          "temporary folder, and show the diff only if that run no longer "
                          "reports what it cures and reports nothing new. With -- COMMAND, "
                          "the same command is re-run with the patched copy in place of "
                          "the script it names")
    run.add_argument("--patch", metavar="PATH",
                     help="with --fix: also write the verified patch to PATH (git apply)")
    run.add_argument("--apply", action="store_true",
                     help="with --fix: write a verified patch into the script, keeping the "
                          "original as SCRIPT.orig; never a patch that did not verify")
    run.add_argument("script", nargs="?", help="the training script")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    run.set_defaults(launch_command=None)
    run.set_defaults(handler=run_command)

    analyze = commands.add_parser(
        "analyze", help="diagnose a job from its traces or from torch's Flight Recorder dumps",
        description="Read DIR/rank-*.jsonl (and rank-*.stacks) written by 'torchrun ... -m "
                    "distdoctor.userjob --trace-dir DIR SCRIPT' on one or many machines, and "
                    "diagnose them as 'distdoctor run' would. Where DIR holds no such traces, "
                    "read the Flight Recorder dumps torch wrote there (one file per rank, "
                    "named <prefix><rank>, as pickles or JSON, from any job and any launcher: "
                    "TORCH_FR_DUMP_TEMP_FILE, by default ~/.cache/fr_trace/nccl_trace_rank_) "
                    "and name the cause from them alone. Give one DIR per machine when each "
                    "wrote its own; their ranks are read as one job. Dumps are read as plain "
                    "data only: a file that would run code is refused.")
    analyze.add_argument("directories", metavar="DIR", nargs="+")
    analyze.add_argument("--report", metavar="PATH", help="also write the report as JSON")
    analyze.add_argument("--all-frames", action="store_true", help=ALL_FRAMES)
    analyze.add_argument("--html", type=html_file, metavar="PATH", help=HTML)
    analyze.add_argument("--run", metavar="ID", help="analyse this run's traces, where a "
                         "folder holds several runs' (each trace names its run)")
    analyze.add_argument("--prefix", metavar="PREFIX", help="read only the dumps whose names "
                         "start with PREFIX (the rest of the name is the rank), as "
                         "TORCH_FR_DUMP_TEMP_FILE's last part: nccl_trace_rank_; by default "
                         "every file that opens as a dump")
    analyze.set_defaults(handler=analyze_command)


def run_command(args: argparse.Namespace) -> int:
    """``distdoctor run``; its ranks (and a --fix's verifying runs) measure their training
    state against --memory-budget when it is given (trace/memory.py reads it there)."""
    from distdoctor.userjob.launching.budget import memory_budget

    with memory_budget(args.memory_budget):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from distdoctor.launch import procs
    from distdoctor.launch.store import AddressError, addresses, is_loopback
    from distdoctor.userjob.launching.launcher import ScriptStartError, run_script
    from distdoctor.userjob.launching.output import OutputSpec
    from distdoctor.userjob.reporting.record import script_record

    if (args.patch or args.apply) and not args.fix:
        raise UsageError("--patch and --apply go with --fix")
    if args.patch and not Path(args.patch).resolve().parent.is_dir():
        raise UsageError(f"--patch {args.patch}: no such folder to write it in")
    if args.launch_command is not None:
        return launch_command(args)
    if args.script is None:
        raise UsageError("give a SCRIPT, or -- and a COMMAND to run as is")
    script = Path(args.script)
    if not script.is_file():
        raise UsageError(f"no such script: {args.script}")
    try:
        addresses(args.master_addr)
    except AddressError as exc:
        raise UsageError(str(exc)) from None
    if not is_loopback(args.master_addr):
        print(f"distdoctor run: the rendezvous store listens on {args.master_addr}, open to "
              f"whoever can reach it", file=sys.stderr, flush=True)
    outside = sorted(r for r in args.local_ranks_filter or () if r >= args.nproc_per_node)
    if outside:
        raise UsageError(f"--local-ranks-filter names rank {outside[0]}, but there are only "
                         f"{args.nproc_per_node} ranks (0-{args.nproc_per_node - 1})")
    try:
        try:
            result = run_script(str(script), args.args, args.nproc_per_node, args.deadline,
                                host=args.master_addr, port=args.master_port,
                                light=args.light, start_method=args.start_method,
                                output=OutputSpec(args.tee, args.local_ranks_filter))
        except (ScriptStartError, AddressError) as exc:
            raise UsageError(str(exc).splitlines()[0]) from None
        # the report first: the killed ranks' memory is freed meanwhile
        record = script_record(result.ends, result.traces, result.wall_s, result.started,
                               args.deadline)
        if args.fix:
            from distdoctor.cli.fix import report_with_fixes

            return report_with_fixes(record, script, args)
        return report_record(record, args.script, args.report, all_frames=args.all_frames,
                             html=args.html)
    finally:
        procs.wait_reaped()  # no rank outlives the command


def launch_command(args: argparse.Namespace) -> int:
    """``distdoctor run -- COMMAND``: the command's own launcher starts the ranks."""
    import shutil

    from distdoctor.userjob.launching.command import CommandStartError, run_command

    argv = args.launch_command
    if not argv:
        raise UsageError("give the COMMAND to run after --")
    for option, default in (("nproc_per_node", 2), ("master_port", 0), ("tee", 0),
                            ("local_ranks_filter", None), ("start_method", "auto"),
                            ("master_addr", "127.0.0.1")):
        if getattr(args, option) != default:
            raise UsageError(f"--{option.replace('_', '-')} is for SCRIPT; with -- COMMAND "
                             f"the command's own launcher starts the ranks")
    try:
        result = run_command(argv, args.deadline, light=args.light)
    except CommandStartError as exc:
        raise UsageError(str(exc)) from None
    try:
        return _report_groups(result, " ".join(argv), args)
    finally:
        shutil.rmtree(result.root, ignore_errors=True)


def _report_groups(result, command: str, args: argparse.Namespace) -> int:
    """One report per process group the command made (the hung one, or the first that
    failed, is the one --report and --html write), then the command's own end."""
    from distdoctor.cli.published import publish
    from distdoctor.userjob.reporting.groups import UnreadableGroup, group_reports
    from distdoctor.userjob.reporting.report import render

    how = (f"stopped by distdoctor (process group {result.groups.index(result.stopped_hung) + 1}"
           f" hung)" if result.stopped_hung is not None else
           "stopped by distdoctor (its rendezvous of nodes never completes)"
           if result.code is None else f"exited with code {result.code}")
    if result.unformed is not None:
        return report_unformed(result.unformed, command, how, result.wall_s, args.report)
    if not result.groups:
        print(f"distdoctor run: no process of '{command}' initialised a process group under "
              f"distdoctor (it {how}); nothing to diagnose. A Python that does not have "
              f"distdoctor installed, or one started with -I or -S, is not traced",
              flush=True)
        return 0 if result.code == 0 else 1
    failed, chosen = False, None
    judged = group_reports(result.groups, command, args.deadline, args.all_frames)
    for number, group in enumerate(judged, 1):
        if isinstance(group, UnreadableGroup):
            print(f"distdoctor run: process group {number}: cannot read its traces "
                  f"({group.reason})")
            failed = True
            continue
        if len(result.groups) > 1:
            print(f"\n== process group {number} of {len(result.groups)} "
                  f"({_group_origin(group.job)}) ==", flush=True)
        for note in group.job.notes:
            print(f"distdoctor run: partial evidence: {note}", flush=True)
        print(render(group.report, "run", group.job.partial), flush=True)
        failed |= group.report.status != "ok"
        if chosen is None and (group.report.status != "ok"
                               or group.directory == result.groups[-1]):
            chosen = (group.record, group.report)
    print(f"\ndistdoctor run: '{command}' {how} after {result.wall_s:.1f} s", flush=True)
    refused = ""
    if chosen is not None and args.fix:
        from distdoctor.cli.fix import command_fixes

        fixes, refused = command_fixes(chosen[1], args.launch_command, args)
        chosen = (chosen[0], dataclasses.replace(chosen[1], fixes=fixes))
    if chosen is not None:
        publish(*chosen, "run", args.report, args.html)
    if refused:
        raise UsageError(f"the verified patch was not written: {refused}")
    return 1 if failed or result.code != 0 else 0


def report_unformed(unformed, command: str, how: str, wall_s: float | None,
                    report_path: str | None) -> int:
    """torchrun's nodes never met, so no rank exists: the cause alone, in text and JSON
    (``wall_s``: how long the command ran, None for a job attached to)."""
    from distdoctor.userjob.reporting.report import Cause, ScriptReport, render

    cause = Cause(unformed.kind, [], unformed.summary, unformed.fix)
    name = "run" if wall_s is not None else "attach"
    report = ScriptReport("failed", cause, [], command, wall_s or 0.0, findings=[cause])
    print(render(report, name), flush=True)
    ran = f" after {wall_s:.1f} s" if wall_s is not None else ""
    print(f"\ndistdoctor {name}: '{command}' {how}{ran}"
          f"{'' if unformed.proven else ' (no rank was started)'}", flush=True)
    if report_path:
        report.write(report_path)
        print(f"\nwrote {report_path}")
    return 1


def _group_origin(job) -> str:
    """"2 ranks, init_process_group at tutorial.py:40", from the ranks' start lines."""
    from distdoctor.models.calls import relative_line
    from distdoctor.models.events import Ev

    start: dict = next((e for events in job.events for e in events
                        if e.get("ev") == Ev.START), {})
    where = start.get("init") if isinstance(start.get("init"), str) else ""
    return f"{len(job.ends)} ranks" + (f", init_process_group at {relative_line(where)}"
                                       if where else "")


def analyze_command(args: argparse.Namespace) -> int:
    from distdoctor.userjob.reporting.record import script_record
    from distdoctor.userjob.reporting.traces import TraceError, has_traces, load

    if args.prefix is not None or not any(has_traces(d) for d in args.directories):
        return analyze_dumps(args)

    try:
        job = load(args.directories, args.run)
    except (TraceError, OSError) as exc:
        raise UsageError(str(exc)) from None
    for note in job.notes:
        print(f"distdoctor analyze: partial evidence: {note}", flush=True)
    return report_record(script_record(job.ends, job.events, 0.0, 0.0, 0.0),
                   " ".join(args.directories), args.report, "analyze", job.partial,
                   args.all_frames, args.html)


def analyze_dumps(args: argparse.Namespace) -> int:
    """The Flight Recorder dumps in the directories, judged as one job."""
    from distdoctor.dumps.collect import Refused, read_all
    from distdoctor.dumps.files import NoDumps, find
    from distdoctor.dumps.job import record_of

    try:
        files, notes = find(args.directories, args.prefix)
        if not files:
            raise NoDumps(f"no rank-*.jsonl traces and no Flight Recorder dumps in "
                          f"{' '.join(args.directories)}"
                          + (f" named {args.prefix}<rank>" if args.prefix else ""))
        dumps = read_all(files)
    except (NoDumps, Refused) as exc:
        raise UsageError(str(exc)) from None
    if not dumps.reads:
        raise UsageError(f"none of the {len(files)} dump files could be read: "
                         + "; ".join(dumps.notes[:3]))
    if all(read.entries == 0 for read in dumps.reads.values()):
        # nothing to judge: an OK here would claim ranks finished that may be hung
        raise UsageError(
            f"the {len(dumps.reads)} Flight Recorder dump(s) in {' '.join(args.directories)} "
            f"hold no operations, so they say nothing of how the job went (written before "
            f"the first collective, with the recorder off, or a job of gloo sends and "
            f"receives, which its recorder does not hold); analyze the ranks' traces "
            f"instead (distdoctor run, or python -m distdoctor.userjob --trace-dir)")
    record, said, limits = record_of(dumps)
    versions = sorted({r.version for r in dumps.reads.values()})
    backends = sorted({r.backend for r in dumps.reads.values() if r.backend})
    print(f"distdoctor analyze: {len(dumps.reads)} Flight Recorder dumps of "
          f"{len(record.ranks)} ranks (schema {', '.join(versions)}"
          f"{', ' + ', '.join(backends) if backends else ''})", flush=True)
    for note in notes + list(said):
        print(f"distdoctor analyze: partial evidence: {note}", flush=True)
    for note in limits:
        print(f"distdoctor analyze: note: {note}", flush=True)
    return report_record(record, " ".join(args.directories), args.report, "analyze",
                         bool(notes or said), args.all_frames, args.html)


def report_record(record, script: str, report_path: str | None, command: str = "run",
                  partial: bool = False, all_frames: bool = False,
                  html: str | None = None) -> int:
    """Every detector on the record, the report printed, and written as JSON and HTML
    where asked; 0 when the run is clean, else 1."""
    from distdoctor.cli.published import publish
    from distdoctor.userjob.reporting.record import explain
    from distdoctor.userjob.reporting.report import render

    result = explain(record, script, all_frames)
    print(render(result, command, partial), flush=True)
    return publish(record, result, command, report_path, html)

