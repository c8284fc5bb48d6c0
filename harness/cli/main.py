"""The ``distdoctor`` command (also ``python -m distdoctor``).

Bad input gets one line on stderr and exit code 2; a run that fails its verdict exits 1.
SIGTERM is turned into an orderly exit so the ranks are stopped and reaped before the
parent goes (a parent killed outright still takes them along: see distdoctor.launch.procs).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Sequence

from distdoctor.cli import attach as attach_cli
from distdoctor.cli import collectives as collectives_cli
from distdoctor.cli import demo as demo_cli
from distdoctor.cli import diagnose as diagnose_cli
from distdoctor.cli import exercise as exercise_cli
from distdoctor.cli import faults as faults_cli
from distdoctor.cli import memory as memory_cli
from distdoctor.cli import pipeline as pipeline_cli
from distdoctor.cli import resume as resume_cli
from distdoctor.cli import run as script_cli
from distdoctor.cli import train as train_cli
from distdoctor.cli.args import Parser, UsageError
from distdoctor.launch.pool import PoolStartError


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="distdoctor",
        description="Run real multi-process PyTorch training, inject classic distributed "
                    "bugs, detect them from what the ranks recorded, and prove the fix.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    commands.required = True
    train_cli.add_commands(commands)
    diagnose_cli.add_commands(commands)
    demo_cli.add_commands(commands)
    exercise_cli.add_commands(commands)
    pipeline_cli.add_commands(commands)
    script_cli.add_commands(commands)
    resume_cli.add_commands(commands)
    attach_cli.add_commands(commands)
    collectives_cli.add_commands(commands)
    memory_cli.add_commands(commands)

    faults_cli.add_commands(commands)
    return parser


def _usage_error(message: str, args: argparse.Namespace) -> int:
    """One line, naming the command as argparse's own refusals do."""
    words = [w for w in (getattr(args, "command", None),
                         getattr(args, "pipeline_command", None)) if w]
    print(f"{' '.join(['distdoctor', *words])}: error: {message}", file=sys.stderr)
    return 2


# the commands that take ``-- COMMAND`` in place of a SCRIPT
TAKES_A_COMMAND = ("run", "resume-check")


def _launch_command(argv: list[str]) -> list[str] | None:
    """``distdoctor run [OPTIONS] -- COMMAND ...``: the command after the first ``--``."""
    if not argv or argv[0] not in TAKES_A_COMMAND or "--" not in argv:
        return None
    return argv[argv.index("--") + 1:]


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    launch = _launch_command(argv)
    args, extra = build_parser().parse_known_args(
        argv if launch is None else argv[:len(argv) - len(launch) - 1])
    if launch is not None and getattr(args, "script", None) is None:
        args.launch_command = launch
    elif launch is not None:  # "run SCRIPT -- ARGS": the script's own arguments
        args, extra = build_parser().parse_known_args(argv)
    if extra:  # refused by the command, not by "distdoctor", as argparse would say
        return _usage_error(f"unrecognized arguments: {' '.join(extra)}", args)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if in_main_thread else None
    try:
        code = args.handler(args)
        sys.stdout.flush()  # a reader that went away shows here, not at interpreter exit
        return code
    except BrokenPipeError:  # `distdoctor ... | head`: stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except UsageError as exc:
        return _usage_error(str(exc), args)
    except KeyboardInterrupt:
        print("distdoctor: interrupted; every rank was stopped", file=sys.stderr)
        return 130
    except PoolStartError as exc:  # the ranks could not form a group as asked
        return _usage_error(str(exc).strip().splitlines()[-1], args)
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
