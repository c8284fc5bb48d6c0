"""``python -m distdoctor.userjob SCRIPT [ARGS...]``: run a user's script as one traced rank.

The script runs unchanged as ``__main__`` (it reads RANK, WORLD_SIZE, ... and calls
``dist.init_process_group`` itself); before it starts, the collective tracer is installed
and DDP is taught to record its parameters' names (so DDP's "Parameter indices which did
not receive grad: 2 3" can be read as names). Two ways to run:

* under ``distdoctor run``, which passes pipe descriptors: results go home over them, the
  parent can ask for stacks at any time, and it decides when the ranks are hung;
* under a real ``torchrun`` (several machines), with ``--trace-dir DIR``: each rank writes
  ``rank-<RANK>.jsonl`` (its calls, then how it ended) and, when it makes no call for
  ``--deadline`` seconds, a deadlock is proven from the traces in DIR (dirwatch.py), or
  it gets SIGTERM, its stacks to ``rank-<RANK>.stacks``; ``distdoctor analyze DIR``
  diagnoses them afterwards.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import os
import runpy
import signal
import socket
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Callable

from distdoctor.launch import procs, stacks
from distdoctor.models import deadlines
from distdoctor.models.events import Ev

HANG_EXIT = 124  # what --exit-on-hang ends a stalled rank with (timeout(1)'s code)
_REAL_EXIT = os._exit  # ours: the script's own os._exit is patched to say so first


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m distdoctor.userjob")
    parser.add_argument("--fds", help=argparse.SUPPRESS)  # conn,ctrl,faulthandler,trace
    parser.add_argument("--trace-dir", help="write this rank's trace and stacks here")
    parser.add_argument("--deadline", type=float, default=deadlines.IN_RANK_S,
                        help="with --trace-dir: seconds without a call before this rank "
                             "writes its stacks (default: %(default)s)")
    parser.add_argument("--exit-on-hang", action="store_true",
                        help="with --trace-dir: once this rank has written its stacks at the "
                             "deadline, end it (exit code %d), so torchrun stops the job and "
                             "the other ranks write theirs; without it the job waits on, "
                             "as it would without distdoctor" % HANG_EXIT)
    parser.add_argument("--light", action="store_true",
                        help="trace calls only (hangs, crashes, mismatches), not the evidence "
                             "of the silent bugs (gradients, batches, non-finite values)")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    if options.fds:
        _run_under_distdoctor(options)
    elif options.trace_dir:
        _run_into_directory(options)
    else:
        parser.error("give --trace-dir (under torchrun), or run through 'distdoctor run'")


def _run_under_distdoctor(options: argparse.Namespace) -> None:
    conn_fd, ctrl_fd, faulthandler_fd, trace_fd = map(int, options.fds.split(","))
    conn, ctrl = Connection(conn_fd), Connection(ctrl_fd)
    code = 1
    try:
        procs.become_rank(int(os.environ["DISTDOCTOR_PARENT_PID"]), set_threads=False)
        stacks.arm_faulthandler(faulthandler_fd)
        stacks.serve_stacks(ctrl)
        faulthandler.enable(sys.stderr, all_threads=True)
        _line_buffered(sys.stdout)
        tracer = install(trace_fd, options.light)
        conn.send(("ready", procs.now()))
        conn.recv_bytes()  # the parent says go once every rank is up
        error = _run_script(options.script, options.args)
        code = _exit_code(error, traceback_to_stderr=False)  # the parent shows it
        if code == 0:
            from distdoctor.trace import jobend

            jobend.job_ended(tracer)
        if error:
            conn.send(("raised", procs.now(), error))
        elif code == 0:
            conn.send(("done", procs.now(), None))
        # else: sys.exit(N) with N != 0, a crash by its exit code, as any launcher sees it
    except (EOFError, OSError, KeyboardInterrupt):
        pass
    finally:
        _exit(code)


def _line_buffered(stream) -> None:
    """stdout is the launcher's pipe, which Python would buffer in blocks: each line goes
    out as it is printed instead, as on a terminal, so the lines of a rank that is later
    stopped are seen, in order with its stderr."""
    try:
        stream.reconfigure(line_buffering=True)
    except (AttributeError, ValueError):
        pass  # not a text stream of ours (closed, or replaced)


def _run_into_directory(options: argparse.Namespace) -> None:
    rank = os.environ.get("RANK", "0")
    try:
        os.makedirs(options.trace_dir, exist_ok=True)
        trace = os.open(os.path.join(options.trace_dir, f"rank-{rank}.jsonl"),
                        os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        stack_file = open(os.path.join(options.trace_dir, f"rank-{rank}.stacks"), "w")
    except OSError as exc:  # the user's job runs whatever happens to our traces
        from distdoctor.trace.tracer import untraced

        untraced(f"cannot write traces to {options.trace_dir} ({exc.strerror or exc})")
        _exit(_exit_code(_run_script(options.script, options.args)))
    faulthandler.register(signal.SIGTERM, file=stack_file, all_threads=True, chain=True)
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    # a fatal signal (gloo aborting a rank whose collective's size its peers did not
    # share, a segfault) leaves the rank's Python stacks beside its trace: the launcher
    # keeps its stderr, where the backend's message went
    faulthandler.enable(stack_file, all_threads=True)
    tracer = install(trace, options.light)
    patch_os_exit(lambda code: say_exit(tracer, code))
    # the watch first, so its thread is named in the start line (it reads the traces only
    # once its rank has been quiet, after the start line is out)
    watch_for_stalls(tracer, options.deadline, stack_file, options.exit_on_hang,
                     options.trace_dir, _run_id(), int(rank))
    tracer.write(ev=Ev.START, t=procs.now(), run=_run_id(), rank=int(rank), pid=os.getpid(),
                 host=socket.gethostname(),
                 world=int(os.environ.get("WORLD_SIZE", "0") or 0), threads=thread_names())
    error = _run_script(options.script, options.args)
    code = _exit_code(error)
    say_exit(tracer, code, error)
    _exit(code)


def _run_id() -> str:
    """The same on every rank of one run, and (mostly) different between runs: torchrun's
    run id, else the rendezvous address."""
    run = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if run and run != "none":
        return run
    return f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"


def _exit_code(error: str | None, traceback_to_stderr: bool = True) -> int:
    """The code the script would have exited with on its own, saying what Python says: an
    uncaught exception's traceback on stderr (unless the parent reports it) and 1;
    ``sys.exit(code)``'s code, and its message on stderr when the code is one."""
    if error:
        if traceback_to_stderr:
            sys.stderr.write(error)
        return 1
    left = next((kept for kept in _KEPT if isinstance(kept, SystemExit)), None)
    if left is None or left.code is None:
        return 0
    if isinstance(left.code, int):
        return left.code
    sys.stderr.write(f"{left.code}\n")  # sys.exit("message"), as Python prints it
    return 1


def say_exit(tracer, code: int, error: str | None = None) -> None:
    """The rank's end in its trace: finished (code 0), raised (a traceback), or exited
    with a code; ``distdoctor analyze`` reads it."""
    status = "raised" if error else "finished" if code == 0 else "exited"
    if status == "finished":  # a script leaving by os._exit(0) comes here too
        from distdoctor.trace import jobend

        jobend.job_ended(tracer)
    tracer.write(ev=Ev.EXIT, t=procs.now(), status=status, error=error, code=code)


def patch_os_exit(say: Callable[[int], None]) -> None:
    """A script that leaves by ``os._exit(code)`` (common, to skip the process group's
    teardown) still says how it ended: its trace gets the exit, written (unbuffered, like
    every trace line) before the process goes, so it reads as finished, not killed."""
    rank_pid = os.getpid()

    def _exit_said(code: int) -> None:
        # only the rank itself: a process forked from it (a DataLoader worker) inherits
        # this patch and the trace's descriptor, and multiprocessing's children leave by
        # os._exit; a worker's end written as the rank's would make a hung rank read as
        # finished
        if os.getpid() == rank_pid:
            try:
                say(int(code))
            # The end is being said as the rank exits: a failure cannot be said anywhere.
            except Exception:  # noqa: BLE001, S110
                pass
        _REAL_EXIT(code)

    setattr(os, "_exit", _exit_said)  # noqa: B010 (a patch)


def install(fd: int, light: bool = False, rank: int | None = None, startup: bool = True):
    """The tracer on ``fd`` (this rank's calls), DDP's parameter names and, unless
    ``light``, the recorders of the silent bugs' evidence. ``startup``: the script has not
    yet called ``init_process_group``: record what it gives it (trace/startup.py)."""
    from distdoctor.trace import jobend
    from distdoctor.trace.recorders import install_recorders
    from distdoctor.trace.startup import record_startup
    from distdoctor.trace.tracer import Tracer

    if rank is None:
        rank = int(os.environ.get("RANK", "-1"))
    tracer = Tracer(fd, rank).install()
    if startup:
        record_startup(tracer)
    jobend.before_teardown(tracer)
    tracer.record_ddp_parameters()
    if not light:
        install_recorders(tracer)
    return tracer


# What the script left (its globals, or the exception and so its frames), kept alive to
# the end: the rank leaves by os._exit, and freeing them first runs destructors (DDP's,
# the process group's) that can block forever in a peer's teardown, as a rank forked
# from a process that has trained before was seen to (1 run in ~8)
_KEPT: list = []


def _run_script(script: str, args: list[str]) -> str | None:
    """Run ``script`` as __main__; its traceback if it raised, else None. Nothing the script
    made is freed afterwards (see ``_KEPT``), and no garbage collection runs."""
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        _KEPT.append(runpy.run_path(script, run_name="__main__"))
    except SystemExit as exc:
        _KEPT.append(exc)  # leaving on purpose is not a crash: a peer still waiting is the
        # problem
    # The user's script may raise anything: kept, and reported as its crash.
    except BaseException as exc:  # noqa: BLE001
        _KEPT.append(exc)
        tb = exc.__traceback__
        while tb is not None and (tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__)
                                  or tb.tb_frame.f_code.co_filename.startswith("<frozen")):
            tb = tb.tb_next  # start the traceback at the script
        return "".join(traceback.format_exception(type(exc), exc, tb))
    finally:
        gc.disable()
    return None


def thread_names() -> dict[str, str]:
    """Each thread's name by the id faulthandler prints for it ("0x00007f..."), so the
    stacks it writes can be read by name, and distdoctor's own threads left out."""
    return {f"0x{t.ident:016x}": t.name for t in threading.enumerate() if t.ident}


def watch_for_stalls(tracer, deadline: float, stack_file, exit_on_hang: bool,
                     directory: str, run: str, rank: int, world: int | None = None,
                     watched: bool = False) -> threading.Event:
    """Under torchrun nobody watches from outside: a rank that makes no call for
    ``deadline`` seconds, or sees a deadlock proven from the traces (dirwatch.py; the
    node's local rank 0 looks), writes down its own stacks once, notes the moment, and
    says so on stderr once (the job itself waits on, unless ``exit_on_hang``).
    ``watched``: distdoctor watches the directory from outside (``run -- COMMAND``): it
    proves deadlocks, keeps the deadline for the whole group (no call on any rank, which a
    rank alone cannot see: its own quiet may be a long start while its peers train), asks
    silent ranks for their stacks and reports, so the rank writes its stall, quietly,
    when told. Setting the event returned ends the watch (the rank's
    process group was destroyed)."""
    from distdoctor.analysis.waitfor import PROOF_SWITCH
    from distdoctor.models.jsoncodec import to_json
    from distdoctor.trace.lines import main_thread_seen
    from distdoctor.trace.loading import LoadWatch
    from distdoctor.userjob.watching import dirwatch

    if world is None:
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    watching = dirwatch.TraceDirectory(directory, world, run) \
        if not watched and os.environ.get("LOCAL_RANK", "0") == "0" and world > 1 \
        and os.environ.get(PROOF_SWITCH, "1") != "0" else None

    stop = threading.Event()
    up_at: list[float] = []  # when the rank was first seen in its process group
    loads = LoadWatch(procs.now())  # loading code is moving (trace/loading.py)

    def quiet_and_limit(now: float) -> tuple[float, float]:
        """Seconds the rank has made no call, and the limit they are judged by. Until
        init_process_group returns, the rank may wait for peers still importing torch
        (seconds each on a busy machine): start-up is judged by deadlines.START_S, never
        by a job's shorter deadline. After, a rank loading code (DDP's first construction)
        is moving as much as one making calls."""
        loaded = loads.note(now)
        if not up_at and _in_process_group():
            up_at.append(now)
        if up_at:
            return now - max(tracer.last_event, up_at[0], loaded), deadline
        return now - tracer.started, max(deadline, deadlines.START_S)

    def watch() -> None:
        while not stop.wait(min(dirwatch.POLL_S, deadline / 4)):
            now = procs.now()
            proven = dirwatch.read_proof(directory, run)
            if proven is None and watching is not None \
                    and now - tracer.last_event >= dirwatch.QUIET_S:
                found = watching.proof(now)
                if found is not None:
                    dirwatch.write_proof(directory, run, found)
                    proven = found.text
            quiet, limit = quiet_and_limit(now)
            if watched:  # distdoctor decides: a proof, or its own deadline for the group
                if proven is None and not dirwatch.stall_called(directory, run):
                    continue
            elif proven is None and quiet < limit:
                continue
            decided_on = tracer.last_event
            seen = main_thread_seen()  # where it is, sampled: a spinning rank moves
            if tracer.last_event != decided_on:
                continue  # its call ended while it was sampled (a peer gone): not stalled
            tracer.write(ev=Ev.STALLED, t=now, threads=thread_names(),
                         seen=to_json(seen),
                         **({"proof": proven} if proven is not None else {}))
            stalled_at = tracer.last_event  # moved on once it changes (see below)
            _write_history(directory, rank)  # first: stacks on disk mean the history is too
            stack_file.write(f"{stacks.MARK} stalled at {now:.3f}\n")
            stack_file.flush()
            faulthandler.dump_traceback(stack_file, all_threads=True)
            stack_file.flush()
            if not watched:
                _say_stalled(limit, stack_file.name, exit_on_hang, proven,
                             started=bool(up_at))
            if watching is not None:  # a peer whose own watch could not run by now
                sizes = watching.trace_sizes()  # (busy holding the GIL) is asked
                time.sleep(dirwatch.POKE_AFTER_S)
                watching.poke_silent(os.getpid(), sizes)
            if exit_on_hang:
                _exit(HANG_EXIT)
            if watched or proven is not None:
                return  # distdoctor's own call for the group, or a proof: final
            # Quiet past the deadline is not yet a hang: a rank waiting for a peer that was
            # slow once (DDP's first construction on a loaded machine) moves on. Once this
            # one makes a call again, its stall is marked as passed and the watch starts
            # over, so a later real hang is written down where it happens (the reader
            # keeps only evidence of a stall the rank never moved past).
            while tracer.last_event == stalled_at:
                if stop.wait(dirwatch.POLL_S):
                    return
            moved = procs.now()
            stack_file.write(f"{stacks.MARK} moved on at {moved:.3f}\n")
            stack_file.flush()
            _say_resumed(moved - (now - quiet))

    threading.Thread(target=watch, name="distdoctor-stall-watch", daemon=True).start()
    return stop


def _write_history(directory: str, rank: int) -> None:
    """This rank's Flight Recorder dump, as torch writes it on a watchdog timeout (every
    collective it holds, torch's own included: DDP's, FSDP's), beside its trace: where
    the sequences parted. ``analyze`` reads it with the trace, or alone (``--prefix
    frdump_rank_``) as it reads any job's dumps."""
    from distdoctor.dumps.files import DUMP_PREFIX
    from distdoctor.dumps.live import dump_bytes

    try:
        found = dump_bytes()
    except Exception as exc:  # noqa: BLE001 (said: the trace notes the history as missing)
        from distdoctor.trace.tracer import incomplete

        incomplete("its Flight Recorder history (the collectives torch made itself)", exc)
        return
    path = os.path.join(directory, f"{DUMP_PREFIX}{rank}")
    with open(path + ".tmp", "wb") as out:
        out.write(found)
    os.replace(path + ".tmp", path)


def _in_process_group() -> bool:
    """Whether the default process group is up (read, never imported: a script that has
    not imported torch.distributed is not in one)."""
    distributed = sys.modules.get("torch.distributed")
    try:
        return bool(distributed is not None and distributed.is_initialized())
    except Exception:  # noqa: BLE001 (torch half-imported on the main thread: not yet up)
        return False


def _say_stalled(deadline: float, stack_path: str, exiting: bool,
                 proven: str | None = None, started: bool = True) -> None:
    rank = os.environ.get("RANK", "?")
    then = (f"This rank now exits with code {HANG_EXIT}, so torchrun stops the job" if exiting
            else "The job is still waiting and will not end by itself: stop it (Ctrl-C, or "
                 "kill torchrun), or pass --exit-on-hang next time")
    why = (f"sees a deadlock proven from the traces ({proven})" if proven is not None else
           f"made no collective or point-to-point call for {deadline:g} s" if started else
           f"has not joined its process group (init_process_group) {deadline:g} s after "
           f"it started")
    sys.stderr.write(f"distdoctor: rank {rank} {why}; its stacks are in {stack_path}. {then}; "
                     f"then run 'distdoctor analyze {os.path.dirname(stack_path) or '.'}'\n")
    sys.stderr.flush()


def _say_resumed(quiet: float) -> None:
    rank = os.environ.get("RANK", "?")
    sys.stderr.write(f"distdoctor: rank {rank} moved on after {quiet:.1f} s quiet: it was "
                     f"waiting, not hung (its stall above is void); still watching\n")
    sys.stderr.flush()


def _exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110 (a closed stream at exit: nothing to flush to)
            pass
    _REAL_EXIT(code)  # no interpreter teardown: torch's destructors can deadlock there

