"""``distdoctor check-collective`` and ``distdoctor collectives``."""

from __future__ import annotations

import argparse

from distdoctor.cli.args import DEADLINE, UsageError, count, seconds
from distdoctor.collectives import KINDS, OPS

MOST_RANKS = 16  # the largest world size check-collective starts on one machine


def _sizes(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    try:
        bounds = (int(low), int(high or low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or N-M, got {text!r}") from None
    if not 1 <= bounds[0] <= bounds[1] <= MOST_RANKS:
        raise argparse.ArgumentTypeError(f"world sizes must be within 1-{MOST_RANKS}, got {text}")
    return bounds


def _transport_help() -> str:
    """The transport a user's function is given, method by method, and an example."""
    from distdoctor.collectives import USER_API

    calls = [f"t.{text}" if "(" in text else ", ".join(f"t.{part}" for part in text.split(", "))
             for text, _ in USER_API]
    width = max(map(len, calls))
    lines = ["the transport (the function's first argument):"]
    lines += [f"  {call:<{width}}  {what}" for call, (_, what) in zip(calls, USER_API)]
    lines += ["", "example (a correct all-reduce, one message per peer):",
              "  def allreduce(t, x):",
              "      out = x.clone()",
              "      for peer in range(t.world_size):",
              "          if peer != t.rank:",
              "              out += t.exchange(x, peer, peer)",
              "      return out",
              "", "  distdoctor check-collective mymodule:allreduce --kind allreduce"]
    return "\n".join(lines)


def add_commands(commands) -> None:
    checker = commands.add_parser(
        "check-collective", help="test your own collective against the reference properties",
        description="Run the collective properties against MODULE:FUNCTION, which receives "
                    "distdoctor's transport (send, recv, isend, rank, world_size) and its "
                    "rank's input tensor (and src for broadcast) and returns the result, "
                    "in the input's dtype (avg of integers truncates toward zero; "
                    "reduce_scatter gives rank r elements [r*c, (r+1)*c) with "
                    "c = ceil(T/N)). Prints the smallest failing example; a hang fails "
                    "too. Exit 0 when every property holds, 1 when not.",
        epilog=_transport_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    checker.add_argument("target", metavar="MODULE:FUNCTION")
    checker.add_argument("--kind", required=True, choices=KINDS)
    checker.add_argument("--op", default="sum", choices=OPS,
                         help="the reduction your function performs (default: %(default)s)")
    checker.add_argument("--world-sizes", type=_sizes, default=(2, 6), metavar="N-M",
                         help="world sizes to try (default: 2-6)")
    checker.add_argument("--examples", type=count(1), default=200,
                         help="examples to try (default: %(default)s)")
    checker.add_argument("--deadline", type=seconds, default=DEADLINE, metavar="SECONDS",
                         help="longest a send or receive may wait before it counts as a hang "
                              "(default: %(default)g). A deadlock the calls prove (a cycle "
                              "of waits, a wait on a rank that returned) fails at once, "
                              "whatever this is; a hang they cannot prove (a rank spinning) "
                              "waits it out once and stops the search")
    checker.add_argument("--transport", choices=("buffered", "rendezvous", "both"),
                         default="both",
                         help="buffered: a send returns at once (a queue); rendezvous: a send "
                              "returns once the peer has received, as on gloo, NCCL with "
                              "large messages and MPI_Ssend, so sends ordered into a cycle "
                              "deadlock; both: every example on each (default: %(default)s)")
    checker.set_defaults(handler=check_command)

    table = commands.add_parser(
        "collectives", help="bytes, steps and time of each collective against its formula",
        description="Run each collective written from scratch over gloo point-to-point on N "
                    "ranks with T float32 elements: bytes each rank sent against the "
                    "formula, communication steps against the formula, and time against "
                    "gloo's own collective on the same data.")
    table.add_argument("--world-size", type=count(2), default=4, metavar="N")
    table.add_argument("--numel", type=count(0), default=1_000_000, metavar="T")
    table.add_argument("--repeats", type=count(1), default=5)
    table.set_defaults(handler=table_command)


def check_command(args: argparse.Namespace) -> int:
    from distdoctor.collectives.checker import WIRES, check, describe, load

    try:
        load(args.target)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    low, high = args.world_sizes
    print(f"check-collective {args.target} --kind {args.kind} --op {args.op}: up to "
          f"{args.examples} examples, world sizes {low}-{high}, transport {args.transport}",
          flush=True)
    wires = WIRES if args.transport == "both" else (args.transport,)
    failure, ran = check(args.target, args.kind, args.op, args.world_sizes, args.examples,
                         args.deadline, wires)
    if failure is None:
        print(f"OK: every property held on {ran} examples")
        return 0
    print(f"FAILED (after {ran} example{'s' * (ran != 1)}, counting hypothesis's shrinking)")
    print(describe(failure, args.kind))
    return 1


def table_command(args: argparse.Namespace) -> int:
    from distdoctor.collectives.measure import measure_all, table

    print(table(measure_all(args.world_size, args.numel, args.repeats), args.world_size,
                args.numel))
    return 0
