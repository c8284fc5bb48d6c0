"""``distdoctor attach PID``: diagnose a job that is running now, started without distdoctor."""

from __future__ import annotations

import argparse
import sys
import time

from distdoctor.cli.args import UsageError, html_file
from distdoctor.cli.run import ALL_FRAMES, HTML

SETTLE_ROUNDS = 2  # more windows of reads while some ranks wait and others still move


def _pid(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"not a process id: {text!r}")
    return int(text)


def add_commands(commands) -> None:
    attach = commands.add_parser(
        "attach", help="diagnose a job running now (hung, usually) that distdoctor did not "
                       "start, without stopping it",
        description="PID is the job's launcher (torchrun's agent, an mp.spawn parent) or any "
                    "of its ranks. distdoctor finds the ranks under it, reads each one's "
                    "Python stacks with py-spy several times without pausing it, asks each "
                    "rank for its Flight Recorder dump where the job set "
                    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE (nccl), and says which rank waits in "
                    "which collective at which line, which ranks are running their own code "
                    "or gone, and the cause, as 'distdoctor run' would. The job is left "
                    "running unless --stop is given. Reading another user's process needs "
                    "ptrace permission (root, or kernel.yama.ptrace_scope=0). Exit 0 when no "
                    "rank is stuck, 1 when a problem was found, 2 when the job cannot be read.")
    attach.add_argument("pid", type=_pid, metavar="PID")
    attach.add_argument("--stop", action="store_true",
                        help="after the diagnosis, stop the job: SIGTERM to its launcher and "
                             "ranks, SIGKILL to whatever is left 5 s later")
    attach.add_argument("--report", metavar="PATH", help="also write the report as JSON")
    attach.add_argument("--all-frames", action="store_true", help=ALL_FRAMES)
    attach.add_argument("--html", type=html_file, metavar="PATH", help=HTML)
    attach.set_defaults(handler=attach_command)


def attach_command(args: argparse.Namespace) -> int:
    from distdoctor.cli.run import report_record
    from distdoctor.models.calls import ranks_phrase, relative_line
    from distdoctor.models.events import Ev
    from distdoctor.userjob.attaching import attach
    from distdoctor.userjob.reporting.record import script_record

    started = time.monotonic()
    try:
        job = attach.find(args.pid)
    except attach.AttachError as exc:
        if isinstance(exc, attach.NoRanks):  # no rank yet: its torchrun agents may say why
            code = _agents_only(args)
            if code is not None:
                return code
        raise UsageError(str(exc)) from None
    print(f"distdoctor attach: job of process {job.launcher}: "
          f"{ranks_phrase(r.rank for r in job.ranks)} of {job.world} "
          f"(process {', '.join(f'{r.pid}' for r in job.ranks)}; numbered by "
          f"{'; '.join(sorted({r.how for r in job.ranks}))})", flush=True)
    job = attach.read_again(job)
    reading = attach.evidence(job, {})
    for _ in range(SETTLE_ROUNDS):  # a rank still on its way to the hang settles, a busy
        if not (reading.waiting and reading.moving):  # one goes on moving
            break
        job = attach.read_again(job, fresh=True)
        reading = attach.evidence(job, {})
    notes = list(reading.notes)
    dumps: dict = {}
    if reading.waiting:  # only then: a dump costs the rank its recorder's time
        dumps, dump_notes = attach.ask_flight_recorders(job)
        notes = dump_notes + notes
        if dumps:
            reading = attach.evidence(job, dumps)
    ends, events = reading.ends, reading.events
    for note in [*job.notes, *notes]:
        print(f"distdoctor attach: {note}", flush=True)
    if not reading.waiting:
        print(f"distdoctor attach: no rank is waiting in a collective or send/receive: "
              f"the job is not stuck in communication (read in "
              f"{time.monotonic() - started:.1f} s)")
        code = 0
    else:
        joining = all(events[r] and events[r][-1].get("ev") == Ev.INIT for r in reading.waiting)
        if not dumps and not joining:  # (a group still forming has no sequence yet)
            print("distdoctor attach: read from the ranks' stacks alone (no Flight Recorder "
                  "dump): where the ranks wait is certain, where their sequences parted "
                  "before is not", flush=True)
        record = script_record(ends, events, 0.0, 0.0, 0.0)
        places = {(trace[-1]["op"], trace[-1]["where"]) for trace in events
                  if trace and trace[-1].get("ev") == Ev.ENTER}
        if not dumps and len(places) == 1 and all(events) and \
                all(trace[-1].get("ev") == Ev.ENTER for trace in events):
            op, where = places.pop()
            print(f"distdoctor attach: every rank waits in {op} at the same line, "
                  f"{relative_line(where)}, and it does not complete: their collective "
                  f"sequences parted before it (one rank made a call more, or fewer). A "
                  f"stack cannot show where; the Flight Recorder can: start the job with "
                  f"TORCH_NCCL_DEBUG_INFO_PIPE_FILE (nccl) or under distdoctor run",
                  flush=True)
        code = report_record(record, f"the job of process {job.launcher}", args.report,
                             "attach", all_frames=args.all_frames, html=args.html)
        print(f"\ndistdoctor attach: read in {time.monotonic() - started:.1f} s; "
              + ("stopping the job (--stop)" if args.stop else
                 "the job is still running (distdoctor attach --stop PID ends it)"),
              flush=True)
    if args.stop:
        stop(job.launcher, [r.pid for r in job.ranks])
    return code


def _agents_only(args: argparse.Namespace) -> int | None:
    """A job whose torchrun agents wait in their rendezvous of nodes: what they wait for,
    and the cause where it is proven (or the start-up deadline has passed); None when no
    agent waits there."""
    from distdoctor.analysis.rendezvous import judge
    from distdoctor.cli.run import report_unformed
    from distdoctor.models import deadlines
    from distdoctor.userjob.attaching.agents import waiting_agents

    agents = waiting_agents(args.pid)
    if not agents:
        return None
    now = time.monotonic()
    unformed = judge(agents, now, deadlines.START_S)
    if unformed is None:
        waits = "; ".join(f"{a.name} for {a.min_nodes} node{'s' * (a.min_nodes != 1)} "
                          f"(--nnodes {a.nnodes}) since {now - a.since:.0f} s" for a in agents)
        print(f"distdoctor attach: no rank yet: torchrun's agents wait in their rendezvous "
              f"of nodes: {waits}. Nothing is proven before {deadlines.START_S:.0f} s; "
              f"attach again later, or to the other nodes' agents together")
        return 0
    code = report_unformed(unformed, f"the job of process {args.pid}",
                           "is still running (distdoctor attach --stop PID ends it)"
                           if not args.stop else "is being stopped (--stop)", None, args.report)
    if args.stop:
        stop(args.pid, [a.pid for a in agents])
    return code


def stop(launcher: int, ranks: list[int]) -> None:
    """SIGTERM the launcher and its tree, then SIGKILL what is left after 5 s."""
    import os
    import signal

    from distdoctor.launch import tree

    everyone = [launcher, *tree.descendants(launcher), *ranks]
    for pid in everyone:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    end = time.monotonic() + 5.0
    while time.monotonic() < end and tree.alive(everyone):
        time.sleep(0.1)
    for pid in everyone:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    print("distdoctor attach: stopped", file=sys.stderr)
