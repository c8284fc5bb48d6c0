"""``distdoctor diagnose``: inject a fault, detect it, apply the findings' fix, verify."""

from __future__ import annotations

import argparse
import time

from distdoctor.cli.args import (
    EVERY_STRATEGY,
    EVERY_STRATEGY_TEXT,
    UsageError,
    html_file,
    run_options,
    spec_from,
)
from distdoctor.cli.faults import check_variant, check_world_size, fault_named
from distdoctor.text import wrap


def add_commands(commands) -> None:
    diagnose = commands.add_parser(
        "diagnose", parents=[run_options(2)],
        help="inject a fault, detect it, apply the fix, and verify it",
        description="Inject FAULT into a run, detect it from what the ranks recorded (the "
                    "detectors never see which fault was injected), apply the fix the "
                    "findings carry, run again, and print the verdict. Exit 0 when the fix "
                    "is verified (or the strategy masks the fault), 1 when not.")
    diagnose.add_argument("--strategy", choices=EVERY_STRATEGY, required=True,
                          help=EVERY_STRATEGY_TEXT, metavar="STRATEGY")
    diagnose.add_argument("--fault", required=True, metavar="FAULT",
                          help="a fault id from 'distdoctor faults'")
    diagnose.add_argument("--variant", metavar="NAME", help="one of the fault's variants "
                          "(default: its first)")
    diagnose.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    diagnose.add_argument("--html", type=html_file, metavar="PATH",
                          help="also write the report as one self-contained HTML page "
                               "(verdict, training curves, and what else fits the run: hang, "
                               "memory, pipeline)")
    diagnose.set_defaults(handler=diagnose_command)


def diagnose_command(args: argparse.Namespace) -> int:
    fault = fault_named(args.fault)  # refused before torch is imported: at once
    check_variant(fault, args.variant)
    if args.strategy not in fault.strategies:
        why = fault.excluded.get(args.strategy, "it is not a failure mode of that strategy")
        raise UsageError(f"{fault.id} does not apply to {args.strategy}: {why}; it applies "
                         f"to {', '.join(fault.strategies)}")
    check_world_size(fault, args.world_size)
    from distdoctor.cli import tables
    from distdoctor.faultloop.diagnose import diagnose
    from distdoctor.models import dump_report

    spec = spec_from(args, args.strategy)
    variant = fault.variant(args.variant)
    print(f"distdoctor diagnose: {fault.id} ({variant.name}) on {spec.strategy}, "
          f"{spec.world_size} {spec.backend} ranks\n"
          f"injected: {tables.changes_text(variant.knobs)} ({variant.description})\n",
          flush=True)
    report = diagnose(fault, spec, args.variant)
    print(tables.diagnosis_text(report), flush=True)
    timing = tables.hang_timing(report.record, time.monotonic())
    if timing:
        print(wrap(timing))
    if args.json:
        dump_report(report, args.json)
        print(f"wrote {args.json}")
    if args.html:
        from distdoctor.pictures import page, reports

        page.write(args.html, reports.diagnosis_page(
            report, f"distdoctor diagnose: {fault.id} ({variant.name}) on {spec.strategy}"))
        print(f"wrote {args.html}")
    return 0 if report.verdict.passed else 1
