"""Argument types and shared options for every distdoctor command.

Bad input is reported as one line and exit code 2: argparse's own errors through
:class:`Parser`, errors found after parsing by raising :class:`UsageError`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

from distdoctor.models import deadlines
from distdoctor.models.strategies import DATA_PARALLEL, TENSOR_HELP, TENSOR_PARALLEL
from distdoctor.models.strategies import HELP as STRATEGY_HELP
from distdoctor.pipeline import PIPELINE_STRATEGIES

# --strategy's choices and help: the data- and tensor-parallel strategies (one training
# workload), and those plus the pipelines
STRATEGY_CHOICES = list(DATA_PARALLEL) + list(TENSOR_PARALLEL)
EVERY_STRATEGY = STRATEGY_CHOICES + list(PIPELINE_STRATEGIES)
STRATEGY_TEXT = "; ".join(f"{name}: {text}" for name, text in
                          {**STRATEGY_HELP, **TENSOR_HELP}.items())
EVERY_STRATEGY_TEXT = STRATEGY_TEXT + ("; pipe-gpipe, pipe-1f1b: hand-rolled pipelines over "
                                       "send/recv; torch-pipe-*: torch.distributed.pipelining")


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


class UsageError(Exception):
    """Bad input found after parsing: one line, exit code 2."""


def number(convert, expected: str, accept, rule: str):
    """An argparse type: ``convert`` the text (else "expected ..."), then ``accept`` it (else
    the ``rule`` it broke), so every numeric option fails in one line the same way."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"{rule}, got {text}")
        return value
    return parse


def count(minimum: int):
    return number(int, "a whole number", lambda v: v >= minimum, f"must be at least {minimum}")


seconds = number(float, "seconds", lambda v: 0 < v < float("inf"),
                 "must be a positive number of seconds")

# a size in bytes: 1000-based (KB, MB, GB, TB) as the memory planner writes them, or
# 1024-based (KiB, MiB, GiB, TiB) as a device's memory is often given
SIZE_UNITS = {"": 1, "B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12,
              "KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30, "TIB": 2 ** 40}


def _bytes_of(text: str) -> int:
    digits = text.strip().upper().rstrip("BKMGTI")
    unit = text.strip().upper()[len(digits):]
    if unit not in SIZE_UNITS or not digits:
        raise ValueError(text)
    return round(float(digits) * SIZE_UNITS[unit])


size_in_bytes = number(_bytes_of, "a size such as 6MB, 80GB or 512MiB",
                       lambda v: 0 < v < 2 ** 63, "must be a positive size")


DEADLINE = deadlines.USER_JOB_S


def run_options(world_size: int, deadline: float = DEADLINE) -> argparse.ArgumentParser:
    """Options every command that trains shares."""
    options = argparse.ArgumentParser(add_help=False)
    group = options.add_argument_group("run")
    group.add_argument("--world-size", type=count(1), default=world_size, metavar="N",
                       help="number of ranks (default: %(default)s)")
    group.add_argument("--num-steps", type=count(1), default=6, metavar="S",
                       help="optimiser steps (default: %(default)s)")
    group.add_argument("--batch-size", type=count(1), default=None, metavar="B",
                       help="samples per rank per step for data parallelism (default: 8), "
                            "per step for a pipeline (default: 16)")
    group.add_argument("--micro-batches", type=count(1), default=None, metavar="K",
                       help="gradient-accumulation micro-batches (default: 1), or pipeline "
                            "micro-batches (default: 8)")
    group.add_argument("--num-samples", type=count(1), default=64, metavar="M",
                       help="data set size; an epoch is M // (N*B) steps (default: %(default)s)")
    group.add_argument("--backend", default="gloo", choices=("gloo", "nccl"),
                       help="process-group backend; nccl needs one GPU per rank "
                            "(default: %(default)s)")
    group.add_argument("--seed", type=int, default=0,
                       help="model, data and shuffle seed (default: %(default)s)")
    group.add_argument("--deadline", type=seconds, default=deadline, metavar="SECONDS",
                       help="seconds without progress before the ranks count as hung and "
                            "are stopped with their stacks (default: %(default)g); a deadlock "
                            "the calls prove is stopped within a fraction of a second, "
                            "whatever this is")
    return options


def html_file(text: str) -> str:
    """Where an HTML report goes: a file, whose folder is made if missing."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file name such as "
                                         f"{path / 'report.html'}")
    if any(parent.exists() and not parent.is_dir() for parent in path.parents):
        raise argparse.ArgumentTypeError(f"cannot write {text}: a file stands where a folder "
                                         f"should be")
    return text


def html_folder(text: str) -> str:
    """Where one HTML page per case goes: a folder, made if missing."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file; give a folder")
    if any(parent.exists() and not parent.is_dir() for parent in path.parents):
        raise argparse.ArgumentTypeError(f"cannot write into {text}: a file stands where a "
                                         f"folder should be")
    return text


def zero_or_more(what: str):
    """A finite number >= 0; ``what`` names it in the error ("a time", "gigabytes")."""
    return number(float, what, lambda v: 0 <= v < float("inf"), "must be zero or more")


cost = zero_or_more("a time")


def spec_from(args: argparse.Namespace, strategy: str, **extra):
    from distdoctor.models import RunSpec

    pipeline = "pipe-" in strategy
    batch = args.batch_size or (16 if pipeline else 8)
    micro = args.micro_batches or (8 if pipeline and batch % 8 == 0 else 1)
    try:
        return RunSpec(strategy=strategy, world_size=args.world_size, num_steps=args.num_steps,
                       batch_size=batch, micro_batches=micro, num_samples=args.num_samples,
                       backend=args.backend, seed=args.seed, deadline=args.deadline, **extra)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
