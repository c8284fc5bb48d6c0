"""The ``distdoctor`` command (also ``python -m harness``).

Bad input gets one line on stderr and exit code 2; a run that fails its verdict exits 1.
SIGTERM is turned into an orderly exit so the ranks are stopped and reaped before the
parent goes (a parent killed outright still takes them along: see harness.launch.procs).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from typing import Sequence

from harness.cli.args import Parser, UsageError, run_options, spec_from
from harness.pipeline import PIPELINE_STRATEGIES as PIPELINES
from harness.cli import collectives as collectives_cli
from harness.cli import memory as memory_cli
from harness.cli import pipeline as pipeline_cli
from harness.cli import run as script_cli
from harness.launch.pool import PoolStartError
from harness.text import wrap
from harness.models.strategies import DATA_PARALLEL
from harness.models.strategies import HELP as STRATEGY_HELP


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="distdoctor",
        description="Run real multi-process PyTorch training, inject classic distributed "
                    "bugs, detect them from what the ranks recorded, and prove the fix.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    commands.required = True
    strategies = list(DATA_PARALLEL)
    all_strategies = strategies + list(PIPELINES)
    strategy_help = "; ".join(f"{name}: {text}" for name, text in STRATEGY_HELP.items())
    every_help = strategy_help + ("; pipe-gpipe, pipe-1f1b: hand-rolled pipelines over "
                                  "send/recv; torch-pipe-*: torch.distributed.pipelining")

    train = commands.add_parser(
        "train", parents=[run_options(2)],
        help="train the clean baseline on N ranks and check it against one process",
        description="Train a small MLP on N real ranks (forked, one process group), print "
                    "loss per rank, parameter spread across ranks, the distance from a "
                    "single-process run on the same samples and the memory each rank held "
                    "(per state, measured from tensor storage, against the ZeRO formula for "
                    "sharded strategies), and write the run record with its verdict as JSON. "
                    "Sharded strategies train with Adam, the rest with SGD. Exit 0 when the "
                    "verdict passes, 1 when not.")
    train.add_argument("--strategy", choices=strategies, default="ddp",
                       help=strategy_help + " (default: %(default)s)")
    out = train.add_mutually_exclusive_group()
    out.add_argument("--out", metavar="PATH", help="where to write the run record and "
                     "verdict (default: outputs/STRATEGY-train.json)")
    out.add_argument("--no-write", action="store_true", help="do not write the JSON record")
    train.set_defaults(handler=_train)

    diagnose = commands.add_parser(
        "diagnose", parents=[run_options(2)],
        help="inject a fault, detect it, apply the fix, and verify it",
        description="Inject FAULT into a run, detect it from what the ranks recorded (the "
                    "detectors never see which fault was injected), apply the fix the "
                    "findings carry, run again, and print the verdict. Exit 0 when the fix "
                    "is verified (or the strategy masks the fault), 1 when not.")
    diagnose.add_argument("--strategy", choices=all_strategies, required=True, help=every_help,
                          metavar="STRATEGY")
    diagnose.add_argument("--fault", required=True, metavar="FAULT",
                          help="a fault id from 'distdoctor faults'")
    diagnose.add_argument("--variant", metavar="NAME", help="one of the fault's variants "
                          "(default: its first)")
    diagnose.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    diagnose.set_defaults(handler=_diagnose)

    demo = commands.add_parser(
        "demo", parents=[run_options(4, deadline=10.0)],
        help="show a failure mode as a short lesson, or all of them",
        description="Each fault as a narrated lesson: what goes wrong, what was measured, "
                    "why, the fix, and the numbers after it. With --all, every fault, then "
                    "one summary table over every variant and strategy.")
    which = demo.add_mutually_exclusive_group(required=True)
    which.add_argument("fault", nargs="?", metavar="FAULT", help="a fault id")
    which.add_argument("--all", action="store_true", help="every fault in the catalogue")
    demo.add_argument("--strategy", choices=all_strategies, metavar="STRATEGY",
                      help="strategy for the lesson (default: the first that shows the "
                           "fault); " + every_help)
    demo.add_argument("--variant", metavar="NAME", help="the fault's variant (default: first)")
    demo.set_defaults(handler=_demo)

    pipeline_cli.add_commands(commands)
    script_cli.add_commands(commands)
    collectives_cli.add_commands(commands)
    memory_cli.add_commands(commands)

    listing = commands.add_parser("faults", help="list the fault catalogue",
                                  description="Every failure mode distdoctor can inject.")
    listing.set_defaults(handler=_faults)
    return parser


def _fault(fault_id: str):
    import faults

    try:
        return faults.get(fault_id)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _train(args: argparse.Namespace) -> int:
    from harness.cli import tables
    from harness.memory.measured import memory_table
    from harness.models import RunReport, dump_report
    from harness.diagnosis.runspec import judge, run

    spec = spec_from(args, args.strategy)
    print(f"distdoctor train: {spec.strategy} on {spec.world_size} {spec.backend} ranks, "
          f"{spec.num_steps} steps, batch {spec.batch_size} per rank, seed {spec.seed}",
          flush=True)
    record = run(spec)
    verdict = judge(record)
    print(tables.step_table(record, verdict.before))
    if not record.finished:
        print(tables.rank_ends(record))
    print(tables.verdict_line(verdict))
    memory = memory_table(record)
    if memory:
        print(memory)
    if not args.no_write:
        out = args.out or f"outputs/{spec.strategy}-train.json"
        dump_report(RunReport(record=record, verdict=verdict), out)
        print(f"wrote {out} (training took {record.wall_s:.2f} s once the ranks were up)")
    return 0 if verdict.passed else 1


def _diagnose(args: argparse.Namespace) -> int:
    from harness.cli import tables
    from harness.diagnosis.diagnose import diagnose
    from harness.models import dump_report

    fault = _fault(args.fault)
    _check_variant(fault, args.variant)
    spec = spec_from(args, args.strategy)
    variant = fault.variant(args.variant)
    print(f"distdoctor diagnose: {fault.id} ({variant.name}) on {spec.strategy}, "
          f"{spec.world_size} {spec.backend} ranks\n"
          f"injected: {tables.changes_text(variant.knobs)} ({variant.description})\n",
          flush=True)
    if spec.strategy in fault.excluded:
        print(wrap(f"note: {fault.id} does not apply to {spec.strategy}: "
                          f"{fault.excluded[spec.strategy]}; running it anyway to show what "
                          f"happens") + "\n", flush=True)
    report = diagnose(fault, spec, args.variant)
    print(tables.diagnosis_text(report), flush=True)
    timing = tables.hang_timing(report.record, time.monotonic())
    if timing:
        print(wrap(timing))
    if args.json:
        dump_report(report, args.json)
        print(f"wrote {args.json}")
    return 0 if report.verdict.passed else 1


def _demo(args: argparse.Namespace) -> int:
    import faults
    from harness.diagnosis.diagnose import diagnose
    from harness.cli.lessons import DemoRow, lesson, masked_note, summary_table

    chosen = list(faults.catalogue().values()) if args.all else [_fault(args.fault)]
    if args.all and args.variant:
        raise UsageError("--variant goes with one FAULT, not --all")
    for fault in chosen:
        _check_variant(fault, args.variant)
        if args.strategy and args.strategy not in fault.strategies:
            raise UsageError(f"fault {fault.id} does not apply to {args.strategy}")
    rows: list[DemoRow] = []
    started = time.monotonic()

    def diagnosed(fault, strategy: str, variant: str | None) -> DemoRow:
        report, seconds = _timed(diagnose, fault, spec_from(args, strategy), variant)
        rows.append(DemoRow(fault.id, fault.variant(variant).name, strategy, args.world_size,
                            report, seconds))
        return rows[-1]

    for fault in chosen:
        strategy = args.strategy or next(s for s in fault.strategies if fault.detectable_on(s))
        text = lesson(fault, diagnosed(fault, strategy, args.variant).report)
        for masked in fault.masked_by if not args.strategy else ():
            text += "\n" + masked_note(diagnosed(fault, masked, args.variant).report)
        print(text + "\n", flush=True)
    if args.all:
        todo = [(fault, variant, strategy) for fault in chosen for variant in fault.variants
                for strategy in fault.strategies
                if not any(r.fault == fault.id and r.variant == variant.name
                           and r.strategy == strategy for r in rows)]
        print(f"sweeping every variant on every strategy: {len(todo)} more diagnoses ...",
              flush=True)
        for done, (fault, variant, strategy) in enumerate(todo, 1):
            row = diagnosed(fault, strategy, variant.name)
            _progress(f"[{done}/{len(todo)}] {fault.id} ({variant.name}) on {strategy}: "
                      f"{row.report.verdict.outcome} in {row.seconds:.1f} s")
        _progress("")
        rows.sort(key=lambda r: (r.fault, r.variant, r.strategy))
        print(summary_table(rows))
        print(f"wall time {time.monotonic() - started:.1f} s")
    return 0 if all(r.report.verdict.passed for r in rows) else 1


def _progress(text: str) -> None:
    """One self-overwriting status line on a terminal's stderr; nothing when redirected."""
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K" + text)
        sys.stderr.flush()


def _timed(fn, *args):
    start = time.monotonic()
    result = fn(*args)
    return result, time.monotonic() - start


def _check_variant(fault, variant: str | None) -> None:
    try:
        fault.variant(variant)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _faults(args: argparse.Namespace) -> int:
    import faults

    from harness.cli.tables import changes_text

    catalogue = faults.catalogue()
    print(f"distdoctor fault catalogue: {len(catalogue)} failure modes\n")
    for fault in catalogue.values():
        print(f"{fault.id}: {fault.title}")
        print(f"  strategies: {', '.join(fault.strategies)}")
        for strategy, why in fault.masked_by.items():
            print(wrap(f"masked on {strategy}: {why}", "  "))
        for strategy, why in fault.excluded.items():
            print(wrap(f"does not apply to {strategy}: {why}", "  "))
        for variant in fault.variants:
            print(wrap(f"variant {variant.name}: {variant.description} "
                       f"({changes_text(variant.knobs)})", "  "))
        for label in ("symptom", "cause", "fix"):
            print(wrap(f"{label}: {getattr(fault, label)}", "  "))
        print()
    return 0


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
        code = args.handler(args)
        sys.stdout.flush()  # a reader that went away shows here, not at interpreter exit
        return code
    except BrokenPipeError:  # `distdoctor ... | head`: stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except UsageError as exc:
        return _usage_error(str(exc))
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
