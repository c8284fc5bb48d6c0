"""``distdoctor train``: the clean baseline on N ranks, checked against one process."""

from __future__ import annotations

import argparse

from distdoctor.cli.args import STRATEGY_CHOICES, STRATEGY_TEXT, run_options, spec_from


def add_commands(commands) -> None:
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
    train.add_argument("--strategy", choices=STRATEGY_CHOICES, default="ddp",
                       help=STRATEGY_TEXT + " (default: %(default)s)")
    out = train.add_mutually_exclusive_group()
    out.add_argument("--out", metavar="PATH", help="where to write the run record and "
                     "verdict (default: outputs/STRATEGY-train.json)")
    out.add_argument("--no-write", action="store_true", help="do not write the JSON record")
    train.set_defaults(handler=train_command)


def train_command(args: argparse.Namespace) -> int:
    from distdoctor.cli import tables
    from distdoctor.faultloop.runspec import judge, run_decided
    from distdoctor.memory.measured import memory_table
    from distdoctor.models import RunReport, dump_report

    spec = spec_from(args, args.strategy)
    print(f"distdoctor train: {spec.strategy} on {spec.world_size} {spec.backend} ranks, "
          f"{spec.num_steps} steps, batch {spec.batch_size} per rank, seed {spec.seed}",
          flush=True)
    record, assessment = run_decided(spec)
    verdict = judge(record, assessment)
    print(tables.step_table(record, verdict.before))
    if not record.finished:
        print(tables.rank_ends(record))
    print(tables.verdict_line(verdict))
    traffic = tables.traffic_line(record)
    if traffic:
        print(traffic)
    memory = memory_table(record)
    if memory:
        print(memory)
    if not args.no_write:
        out = args.out or f"outputs/{spec.strategy}-train.json"
        dump_report(RunReport(record=record, verdict=verdict), out)
        print(f"wrote {out} (training took {record.wall_s:.2f} s once the ranks were up)")
    return 0 if verdict.passed else 1
