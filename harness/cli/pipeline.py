"""``distdoctor pipeline simulate`` and ``distdoctor pipeline run``."""

from __future__ import annotations

import argparse
import importlib.util
import os

from distdoctor.cli.args import Parser, UsageError, cost, count, html_file, run_options, spec_from
from distdoctor.pipeline import PIPELINE_STRATEGIES as PIPELINES
from distdoctor.pipeline.orders import SCHEDULES as SIMULATED


def add_commands(commands) -> None:
    pipeline = commands.add_parser(
        "pipeline", help="simulate pipeline schedules, or run one on real ranks",
        description="Pipeline parallelism: schedule simulators and real runs.")
    pipeline_commands = pipeline.add_subparsers(dest="pipeline_command", metavar="ACTION",
                                                parser_class=Parser)
    pipeline_commands.required = True
    simulate = pipeline_commands.add_parser(
        "simulate", help="bubble, activations and a Gantt chart of a schedule",
        description="Simulate a pipeline schedule from per-action costs: bubble fraction, "
                    "idle time per rank against the published closed form, peak in-flight "
                    "activations and parameter copies, and a Gantt chart.")
    simulate.add_argument("--schedule", default="all", choices=["all", *SIMULATED],
                          help="(default: all, as one table)")
    simulate.add_argument("--stages", type=count(1), default=4, metavar="S")
    simulate.add_argument("--microbatches", type=count(1), default=8, metavar="M")
    for name, default, text in (("f", 1.0, "forward"), ("b", 1.0, "backward for inputs"),
                                ("w", 1.0, "backward for weights"),
                                ("comm", 0.0, "hop between ranks")):
        simulate.add_argument(f"--{name}", type=cost, default=default, metavar="T",
                              help=f"time of a {text} (default: %(default)s)")
    simulate.add_argument("--fb", type=cost, default=None, metavar="T",
                          help="time of an overlapped forward+backward (default: f+b+w)")
    simulate.add_argument("--png", metavar="PATH", help="also draw the chart as PNG "
                          "(needs matplotlib)")
    simulate.add_argument("--html", type=html_file, metavar="PATH",
                          help="also write the table and each schedule's chart as one "
                               "self-contained HTML page")
    simulate.set_defaults(handler=simulate_command)
    pipe_run = pipeline_commands.add_parser(
        "run", parents=[run_options(2)], help="train a pipeline on real ranks",
        description="Train the pipeline workload on S real ranks, check loss, gradients and "
                    "parameters against one process, and compare the bubble it measured with "
                    "the simulator's for the same S, M and the run's own costs.")
    pipe_run.add_argument("--schedule", required=True, choices=list(PIPELINES),
                          metavar="SCHEDULE", help=", ".join(PIPELINES))
    pipe_run.add_argument("--seq-len", type=count(1), default=32)
    pipe_run.add_argument("--d-model", type=count(1), default=16)
    pipe_run.add_argument("--html", type=html_file, metavar="PATH",
                          help="also write the report as one self-contained HTML page: the "
                               "measured Gantt chart beside the simulated one, training "
                               "curves, the verdict")
    pipe_run.set_defaults(handler=run_command)



def simulate_command(args: argparse.Namespace) -> int:
    from distdoctor.pipeline.gantt import png_gantt, text_gantt
    from distdoctor.pipeline.report import simulation_table
    from distdoctor.pipeline.simulate import Costs, run_schedule

    if args.png and args.schedule == "all":
        raise UsageError("--png draws one schedule's chart: name it with --schedule")
    if args.png and not os.path.isdir(os.path.dirname(os.path.abspath(args.png))):
        raise UsageError(f"--png {args.png}: no such directory")
    if args.png and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--png needs matplotlib, which is not installed here (pip install "
                         "matplotlib); the text chart is printed without it")
    costs = Costs(args.f, args.b, args.w, args.fb, args.comm)
    names = list(SIMULATED) if args.schedule == "all" else [args.schedule]
    table_text = simulation_table(names, args.stages, args.microbatches, costs)
    print(table_text)
    if args.schedule != "all":
        try:
            timeline = run_schedule(args.schedule, args.stages, args.microbatches, costs)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        print()
        print(text_gantt(timeline))
        if args.png:
            png_gantt(timeline, args.png)
            print(f"wrote {args.png}")
    if args.html:
        from distdoctor.pictures import page, reports

        timelines = []
        for name in names:
            try:
                timelines.append(run_schedule(name, args.stages, args.microbatches, costs))
            except ValueError:
                pass  # the table says it is not defined here
        page.write(args.html, reports.simulate_page(timelines, table_text))
        print(f"wrote {args.html}")
    return 0


def run_command(args: argparse.Namespace) -> int:
    import dataclasses

    from distdoctor.cli import tables
    from distdoctor.faultloop.runspec import judge, run_decided
    from distdoctor.models import PipeShape
    from distdoctor.pipeline.report import core_note, measured_bubble, pipeline_text, simulated_for
    from distdoctor.pipeline.simulate import simulate as simulate_schedule

    spec = spec_from(args, args.schedule)
    try:
        spec = dataclasses.replace(spec, pipe=PipeShape(spec.pipe.layers, args.seq_len,
                                                        args.d_model))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(f"distdoctor pipeline run: {spec.strategy} on {spec.world_size} {spec.backend} ranks, "
          f"{spec.micro_batches} micro-batches of {spec.batch_size // spec.micro_batches}, "
          f"{spec.num_steps} steps, layers {spec.pipe.layers} (seq {spec.pipe.seq_len}, "
          f"d {spec.pipe.d_model})", flush=True)
    record, assessment = run_decided(spec)
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
    verdict = judge(record, assessment)
    for found in assessment.findings:
        print(tables.finding_text(found))
    label = {"healthy": "PASS", "unhealthy": "FAIL"}.get(verdict.outcome, "INCONCLUSIVE")
    print(f"verdict: {label}: " + tables.numbers_line(assessment)
          + (f"; {verdict.note}" if verdict.note else ""))
    if args.html:
        from distdoctor.models import RunReport
        from distdoctor.pictures import page, reports

        page.write(args.html, reports.diagnosis_page(
            RunReport(record, verdict), f"distdoctor pipeline run: {spec.strategy}"))
        print(f"wrote {args.html}")
    return 0 if verdict.passed else 1
