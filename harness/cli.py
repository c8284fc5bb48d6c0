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
import time
from typing import NoReturn, Sequence

from harness.pipeline import PIPELINE_STRATEGIES as PIPELINES
from harness.pipeline.orders import SCHEDULES as SIMULATED
from harness.pool import PoolStartError
from harness.strategies import STRATEGIES


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


class UsageError(Exception):
    """Bad input found after parsing: one line, exit code 2."""


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


def _run_options(world_size: int) -> argparse.ArgumentParser:
    """Options every command that trains shares."""
    options = argparse.ArgumentParser(add_help=False)
    group = options.add_argument_group("run")
    group.add_argument("--world-size", type=_count(1), default=world_size, metavar="N",
                       help="number of ranks (default: %(default)s)")
    group.add_argument("--num-steps", type=_count(1), default=6, metavar="S",
                       help="optimiser steps (default: %(default)s)")
    group.add_argument("--batch-size", type=_count(1), default=None, metavar="B",
                       help="samples per rank per step for data parallelism (default: 8), "
                            "per step for a pipeline (default: 16)")
    group.add_argument("--micro-batches", type=_count(1), default=None, metavar="K",
                       help="gradient-accumulation micro-batches (default: 1), or pipeline "
                            "micro-batches (default: 8)")
    group.add_argument("--num-samples", type=_count(1), default=64, metavar="M",
                       help="data set size; an epoch is M // (N*B) steps (default: %(default)s)")
    group.add_argument("--backend", default="gloo", choices=("gloo", "nccl"),
                       help="process-group backend; nccl needs one GPU per rank "
                            "(default: %(default)s)")
    group.add_argument("--seed", type=int, default=0,
                       help="model, data and shuffle seed (default: %(default)s)")
    group.add_argument("--deadline", type=_seconds, default=30.0, metavar="SECONDS",
                       help="seconds without progress before the ranks count as hung and "
                            "are stopped with their stacks (default: %(default)s)")
    return options


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="distdoctor",
        description="Run real multi-process PyTorch training, inject classic distributed "
                    "bugs, detect them from what the ranks recorded, and prove the fix.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    strategies = sorted(STRATEGIES)
    all_strategies = strategies + list(PIPELINES)
    strategy_help = ("ddp: hand-rolled (broadcast, all-reduce SUM, divide); torch-ddp: "
                     "torch.nn.parallel.DistributedDataParallel")
    every_help = strategy_help + ("; pipe-gpipe, pipe-1f1b: hand-rolled pipelines over "
                                  "send/recv; torch-pipe-*: torch.distributed.pipelining")

    train = commands.add_parser(
        "train", parents=[_run_options(2)],
        help="train the clean baseline on N ranks and check it against one process",
        description="Train a small MLP on N real ranks (forked, one process group), print "
                    "loss per rank, parameter spread across ranks and the distance from a "
                    "single-process run on the same samples, and write the run record with "
                    "its verdict as JSON. Exit 0 when the verdict passes, 1 when not.")
    train.add_argument("--strategy", choices=strategies, default="ddp",
                       help=strategy_help + " (default: %(default)s)")
    out = train.add_mutually_exclusive_group()
    out.add_argument("--out", default="outputs/ddp-demo.json", metavar="PATH",
                     help="where to write the run record and verdict (default: %(default)s)")
    out.add_argument("--no-write", action="store_true", help="do not write the JSON record")
    train.set_defaults(handler=_train)

    diagnose = commands.add_parser(
        "diagnose", parents=[_run_options(2)],
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
        "demo", parents=[_run_options(4)],
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

    pipeline = commands.add_parser(
        "pipeline", help="simulate pipeline schedules, or run one on real ranks",
        description="Pipeline parallelism: schedule simulators and real runs.")
    pipeline_commands = pipeline.add_subparsers(dest="pipeline_command", metavar="ACTION",
                                                parser_class=_Parser)
    pipeline_commands.required = True
    simulate = pipeline_commands.add_parser(
        "simulate", help="bubble, activations and a Gantt chart of a schedule",
        description="Simulate a pipeline schedule from per-action costs: bubble fraction, "
                    "idle time per rank against the published closed form, peak in-flight "
                    "activations and parameter copies, and a Gantt chart.")
    simulate.add_argument("--schedule", default="all", choices=["all", *SIMULATED],
                          help="(default: all, as one table)")
    simulate.add_argument("--stages", type=_count(1), default=4, metavar="S")
    simulate.add_argument("--microbatches", type=_count(1), default=8, metavar="M")
    for name, default, text in (("f", 1.0, "forward"), ("b", 1.0, "backward for inputs"),
                                ("w", 1.0, "backward for weights"),
                                ("comm", 0.0, "hop between ranks")):
        simulate.add_argument(f"--{name}", type=_cost, default=default, metavar="T",
                              help=f"time of a {text} (default: %(default)s)")
    simulate.add_argument("--fb", type=_cost, default=None, metavar="T",
                          help="time of an overlapped forward+backward (default: f+b+w)")
    simulate.add_argument("--png", metavar="PATH", help="also draw the chart as PNG "
                          "(needs matplotlib)")
    simulate.set_defaults(handler=_pipeline_simulate)
    pipe_run = pipeline_commands.add_parser(
        "run", parents=[_run_options(2)], help="train a pipeline on real ranks",
        description="Train the pipeline workload on S real ranks, check loss, gradients and "
                    "parameters against one process, and compare the bubble it measured with "
                    "the simulator's for the same S, M and the run's own costs.")
    pipe_run.add_argument("--schedule", required=True, choices=list(PIPELINES),
                          metavar="SCHEDULE", help=", ".join(PIPELINES))
    pipe_run.add_argument("--seq-len", type=_count(1), default=32)
    pipe_run.add_argument("--d-model", type=_count(1), default=16)
    pipe_run.set_defaults(handler=_pipeline_run)

    listing = commands.add_parser("faults", help="list the fault catalogue",
                                  description="Every failure mode distdoctor can inject.")
    listing.set_defaults(handler=_faults)
    return parser


def _spec(args: argparse.Namespace, strategy: str, **extra):
    from harness.models import RunSpec

    pipeline = "pipe-" in strategy
    batch = args.batch_size or (16 if pipeline else 8)
    micro = args.micro_batches or (8 if pipeline and batch % 8 == 0 else 1)
    try:
        return RunSpec(strategy=strategy, world_size=args.world_size, num_steps=args.num_steps,
                       batch_size=batch, micro_batches=micro, num_samples=args.num_samples,
                       backend=args.backend, seed=args.seed, deadline=args.deadline, **extra)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _fault(fault_id: str):
    import faults

    try:
        return faults.get(fault_id)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _train(args: argparse.Namespace) -> int:
    from harness import tables
    from harness.models import RunReport, dump_report
    from harness.run import judge, run

    spec = _spec(args, args.strategy)
    print(f"distdoctor train: {spec.strategy} on {spec.world_size} {spec.backend} ranks, "
          f"{spec.num_steps} steps, batch {spec.batch_size} per rank, seed {spec.seed}",
          flush=True)
    record = run(spec)
    verdict = judge(record)
    print(tables.step_table(record, verdict.before))
    if not record.finished:
        print(tables.rank_ends(record))
    print(tables.verdict_line(verdict))
    if not args.no_write:
        dump_report(RunReport(record=record, verdict=verdict), args.out)
        print(f"wrote {args.out} (training took {record.wall_s:.2f} s once the ranks were up)")
    return 0 if verdict.passed else 1


def _diagnose(args: argparse.Namespace) -> int:
    from harness import tables
    from harness.diagnose import diagnose
    from harness.models import dump_report

    fault = _fault(args.fault)
    _check_variant(fault, args.variant)
    spec = _spec(args, args.strategy)
    variant = fault.variant(args.variant)
    print(f"distdoctor diagnose: {fault.id} ({variant.name}) on {spec.strategy}, "
          f"{spec.world_size} {spec.backend} ranks\n"
          f"injected: {tables.changes_text(variant.knobs)} ({variant.description})\n",
          flush=True)
    report = diagnose(fault, spec, args.variant)
    print(tables.diagnosis_text(report), flush=True)
    timing = tables.hang_timing(report.record, time.monotonic())
    if timing:
        print(tables.wrap(timing))
    if args.json:
        dump_report(report, args.json)
        print(f"wrote {args.json}")
    return 0 if report.verdict.passed else 1


def _demo(args: argparse.Namespace) -> int:
    import faults
    from harness.diagnose import diagnose
    from harness.lessons import DemoRow, lesson, masked_note, summary_table

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
        report, seconds = _timed(diagnose, fault, _spec(args, strategy), variant)
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
        print("sweeping every variant on every strategy ...", flush=True)
        for fault in chosen:
            for variant in fault.variants:
                for strategy in fault.strategies:
                    if any(r.fault == fault.id and r.variant == variant.name
                           and r.strategy == strategy for r in rows):
                        continue
                    diagnosed(fault, strategy, variant.name)
        rows.sort(key=lambda r: (r.fault, r.variant, r.strategy))
        print(summary_table(rows))
        print(f"wall time {time.monotonic() - started:.1f} s")
    return 0 if all(r.report.verdict.passed for r in rows) else 1


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

    from harness.tables import changes_text, wrap

    catalogue = faults.catalogue()
    print(f"distdoctor fault catalogue: {len(catalogue)} failure modes\n")
    for fault in catalogue.values():
        print(f"{fault.id}: {fault.title}")
        print(f"  strategies: {', '.join(fault.strategies)}")
        for strategy, why in fault.masked_by.items():
            print(wrap(f"masked on {strategy}: {why}", "  "))
        for variant in fault.variants:
            print(wrap(f"variant {variant.name}: {variant.description} "
                       f"({changes_text(variant.knobs)})", "  "))
        for label in ("symptom", "cause", "fix"):
            print(wrap(f"{label}: {getattr(fault, label)}", "  "))
        print()
    return 0


def _cost(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a time, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text}")
    return value


def _pipeline_simulate(args: argparse.Namespace) -> int:
    from harness.pipeline.gantt import png_gantt, text_gantt
    from harness.pipeline.report import simulation_table
    from harness.pipeline.simulate import Costs, run_schedule

    costs = Costs(args.f, args.b, args.w, args.fb, args.comm)
    names = list(SIMULATED) if args.schedule == "all" else [args.schedule]
    print(simulation_table(names, args.stages, args.microbatches, costs))
    if args.schedule != "all":
        try:
            timeline = run_schedule(args.schedule, args.stages, args.microbatches, costs)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        print()
        print(text_gantt(timeline))
        if args.png:
            print(f"wrote {args.png}" if png_gantt(timeline, args.png)
                  else "no PNG: matplotlib is not installed")
    return 0


def _pipeline_run(args: argparse.Namespace) -> int:
    import dataclasses

    from harness import tables
    from harness.models import PipeShape
    from harness.pipeline.report import core_note, measured_bubble, pipeline_text, simulated_for
    from harness.pipeline.simulate import simulate as simulate_schedule
    from harness.run import assess, run

    spec = _spec(args, args.schedule)
    try:
        spec = dataclasses.replace(spec, pipe=PipeShape(spec.pipe.layers, args.seq_len,
                                                        args.d_model))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(f"distdoctor pipeline run: {spec.strategy} on {spec.world_size} {spec.backend} ranks, "
          f"{spec.micro_batches} micro-batches of {spec.batch_size // spec.micro_batches}, "
          f"{spec.num_steps} steps, layers {spec.pipe.layers} (seq {spec.pipe.seq_len}, "
          f"d {spec.pipe.d_model})", flush=True)
    record = run(spec)
    assessment = assess(record)
    print(pipeline_text(record, assessment))
    bubble = measured_bubble(record)
    simulated = simulated_for(record) if record.finished else None
    if bubble is not None and simulated:
        name, timeline = simulated
        free = simulate_schedule(timeline.schedule, dataclasses.replace(timeline.costs, comm=0))
        print(f"bubble: measured {bubble:.2%}; simulated {name} with this run's per-stage "
              f"times {free.bubble_fraction:.2%}, and {timeline.bubble_fraction:.2%} adding "
              f"its measured hop latency ({timeline.costs.comm * 1e3:.2f} ms); the rest is "
              f"per-call overhead between a rank's actions, which the simulator does not model")
        note = core_note(spec.world_size)
        if note:
            print(note)
    elif bubble is not None:
        print(f"bubble: measured {bubble:.2%} (no simulator for {spec.strategy})")
    print("verdict: " + ("PASS" if assessment.healthy else "FAIL") + ": "
          + tables.numbers_line(assessment))
    return 0 if assessment.healthy else 1


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
