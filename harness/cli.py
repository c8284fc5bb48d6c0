"""The ``distdoctor`` command (also ``python -m harness``).

Bad input gets one line on stderr and exit code 2; a run that fails its verdict exits 1.
SIGTERM is turned into an orderly exit so the ranks are stopped and reaped before the
parent goes (a parent killed outright still takes them along: see harness.procs).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import NoReturn, Sequence

from harness.pool import PoolStartError
from harness.strategies import STRATEGIES


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _count(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="distdoctor",
        description="Run real multi-process PyTorch training, inject classic distributed "
                    "bugs, detect them from what the ranks recorded, and prove the fix.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    train = commands.add_parser(
        "train", help="train the clean baseline on N ranks and check it against one process",
        description="Train a small MLP on N real ranks (forked, one gloo process group), "
                    "print loss per rank, parameter spread across ranks and the distance "
                    "from a single-process run on the same samples, and write the run "
                    "record with its verdict as JSON. Exit 0 when the verdict passes.")
    train.add_argument("--strategy", choices=sorted(STRATEGIES), default="ddp",
                       help="ddp: hand-rolled (broadcast, all-reduce SUM, divide); "
                            "torch-ddp: torch.nn.parallel.DistributedDataParallel "
                            "(default: %(default)s)")
    train.add_argument("--world-size", type=_count(1), default=2, metavar="N",
                       help="number of ranks (default: %(default)s)")
    train.add_argument("--num-steps", type=_count(1), default=6, metavar="S",
                       help="optimiser steps (default: %(default)s)")
    train.add_argument("--batch-size", type=_count(1), default=8, metavar="B",
                       help="samples per rank per step (default: %(default)s)")
    train.add_argument("--micro-batches", type=_count(1), default=1, metavar="K",
                       help="gradient-accumulation micro-batches per step (default: %(default)s)")
    train.add_argument("--num-samples", type=_count(1), default=64, metavar="M",
                       help="data set size; an epoch is M // (N*B) steps (default: %(default)s)")
    train.add_argument("--backend", default="gloo", choices=("gloo", "nccl"),
                       help="process-group backend; nccl needs one GPU per rank "
                            "(default: %(default)s)")
    train.add_argument("--seed", type=int, default=0, help="model, data and shuffle seed "
                                                           "(default: %(default)s)")
    train.add_argument("--deadline", type=_seconds, default=30.0, metavar="SECONDS",
                       help="seconds without progress before the ranks count as hung and "
                            "are stopped with their stacks (default: %(default)s)")
    out = train.add_mutually_exclusive_group()
    out.add_argument("--out", default="outputs/ddp-demo.json", metavar="PATH",
                     help="where to write the run record and verdict (default: %(default)s)")
    out.add_argument("--no-write", action="store_true", help="do not write the JSON record")
    train.set_defaults(handler=_train)
    return parser


def _train(args: argparse.Namespace) -> int:
    from harness.models import RunReport, RunSpec, dump_report

    try:
        spec = RunSpec(strategy=args.strategy, world_size=args.world_size,
                       num_steps=args.num_steps, batch_size=args.batch_size,
                       micro_batches=args.micro_batches, num_samples=args.num_samples,
                       backend=args.backend, seed=args.seed, deadline=args.deadline)
    except ValueError as exc:
        return _usage_error(str(exc))
    print(f"distdoctor train: {spec.strategy} on {spec.world_size} {spec.backend} ranks, "
          f"{spec.num_steps} steps, batch {spec.batch_size} per rank, seed {spec.seed}",
          flush=True)
    from harness import tables
    from harness.run import judge, run

    record = run(spec)
    verdict = judge(record)
    print(tables.step_table(record, verdict))
    if not record.finished:
        print(tables.rank_ends(record))
    print(tables.verdict_line(verdict))
    if not args.no_write:
        dump_report(RunReport(record=record, verdict=verdict), args.out)
        print(f"wrote {args.out} (training took {record.wall_s:.2f} s once the ranks were up)")
    return 0 if verdict.passed else 1


def _usage_error(message: str) -> int:
    print(f"distdoctor: error: {message}", file=sys.stderr)
    return 2


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if in_main_thread else None
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print("distdoctor: interrupted; every rank was stopped", file=sys.stderr)
        return 130
    except PoolStartError as exc:  # the ranks could not form a group as asked
        return _usage_error(str(exc).strip().splitlines()[-1])
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
