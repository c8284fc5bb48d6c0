"""``distdoctor memory``: bytes per rank of every training state, per ZeRO stage, and what
to change when a plan does not fit."""

from __future__ import annotations

import argparse
import math
import re
import textwrap

from distdoctor.cli.args import UsageError, count, zero_or_more
from distdoctor.memory.formulas import GB, PRECISIONS, Precision, StageBytes, deepspeed_estimate
from distdoctor.memory.planner import Model, cheapest_fit, fits, round_up, smallest_world_size
from distdoctor.text import wrap

STAGE_NAMES = {0: "0 DDP", 1: "1 ZeRO-1", 2: "2 ZeRO-2", 3: "3 ZeRO-3/FSDP"}
_SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parameter_count(text: str) -> float:
    """70e9, 70B, 7b, 1.3T, 125M: a positive number of parameters."""
    match = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([kmbgt]?)\s*", text.lower())
    try:
        value = float(match.group(1)) * _SUFFIX[match.group(2)] if match else math.nan
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a parameter count such as 70e9 or 7B, "
                                         f"got {text!r}")
    return value


gigabytes = zero_or_more("gigabytes")


def add_commands(commands) -> None:
    memory = commands.add_parser(
        "memory", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="plan memory per rank for each ZeRO stage, and what fixes a plan over budget",
        description=textwrap.fill(
            "Bytes per rank of parameters, gradients, optimiser state, the gathered largest "
            "layer (ZeRO-3) and activations, for each ZeRO stage, against a per-rank budget. "
            "When a stage does not fit, the fixes and their numbers: a higher stage, more "
            "ranks (and whole nodes), activation checkpointing.", 80) + "\n\n"
                    "precisions (bytes per parameter):\n" + "\n".join(
                        f"  {p.name:13s} {p.per_param:2d}: {p.summary}"
                        for p in PRECISIONS.values()))
    memory.add_argument("--params", type=parameter_count, required=True, metavar="P",
                        help="parameters in the model: 70e9, 70B, 125M")
    memory.add_argument("--world-size", type=count(1), default=8, metavar="N",
                        help="ranks (GPUs) the states are sharded over (default: %(default)s)")
    memory.add_argument("--stage", choices=["0", "1", "2", "3", "all"], default="all",
                        help="ZeRO stage, 0 for DDP (default: all)")
    memory.add_argument("--precision", choices=list(PRECISIONS), default="mixed",
                        help="(default: %(default)s, the 12-byte accounting)")
    memory.add_argument("--budget-gb", type=gigabytes, default=80.0, metavar="B",
                        help="memory per rank, decimal GB (default: %(default)s, an 80 GB card)")
    memory.add_argument("--largest-layer", type=parameter_count, default=None, metavar="L",
                        help="parameters of the largest layer, which ZeRO-3 gathers whole "
                             "(default: 0, and the output says what a typical layer adds)")
    memory.add_argument("--activations-gb", type=gigabytes, default=0.0, metavar="A",
                        help="activation memory per rank (default: %(default)s)")
    memory.add_argument("--tp", type=count(1), default=1, metavar="T",
                        help="tensor-parallel degree: each layer's weights split over T ranks "
                             "of a node, the ZeRO stages sharding over the N/T data-parallel "
                             "ranks (default: 1, none)")
    memory.add_argument("--gpus-per-node", type=count(1), default=8, metavar="G",
                        help="rank counts are also rounded up to whole nodes of G "
                             "(default: %(default)s)")
    memory.set_defaults(handler=memory_command)


def memory_command(args: argparse.Namespace) -> int:
    precision = PRECISIONS[args.precision]
    tp = args.tp
    if args.world_size % tp or args.gpus_per_node % tp:
        raise UsageError(f"--tp {tp} must divide --world-size {args.world_size} and "
                         f"--gpus-per-node {args.gpus_per_node}: a tensor-parallel group "
                         f"stays inside one node, and the data-parallel ranks are N/T")
    # each rank holds 1/T of every split layer; ZeRO shards that over the N/T data-parallel
    # ranks (the norms and biases tensor parallelism replicates are left out: a fraction of
    # a percent of a transformer)
    model = Model(args.params / tp, (args.largest_layer or 0.0) / tp, args.activations_gb * GB)
    budget = args.budget_gb * GB
    stages = [0, 1, 2, 3] if args.stage == "all" else [int(args.stage)]
    n = args.world_size // tp
    split = (f", tensor-parallel over {tp} (each rank holds 1/{tp} of every layer's weights; "
             f"the ZeRO stages shard over the {n} data-parallel ranks)" if tp > 1 else "")
    print(wrap(f"distdoctor memory: {count_text(args.params)} parameters on "
               f"{args.world_size} rank{'s' if args.world_size > 1 else ''}{split}, "
               f"{precision.name} precision ({precision.per_param} bytes per parameter: "
               f"{precision.summary}), budget {args.budget_gb:g} GB per rank") + "\n")
    rows = {s: model.at(s, n, precision) for s in stages}
    print(table(rows, budget, args.params))
    if 3 in stages and args.largest_layer is None:
        print(wrap(layer_assumed_note(model, n, precision)))
    print()
    if precision.name != "fp32":
        print(wrap(precision_note(model, stages[0], n, precision)))
    if tp == 1:  # DeepSpeed's estimators are for data parallelism alone
        print(wrap(deepspeed_note(model, n, precision)))
    if len(stages) == 1:
        stage = stages[0]
        if not fits(rows[stage], budget):
            print()
            print(fixes(model, stage, n, precision, budget, args.gpus_per_node, tp))
    else:
        fitting = [s for s in stages if fits(rows[s], budget)]
        print(f"\nlowest stage that fits on {args.world_size} ranks: "
              + (f"{STAGE_NAMES[fitting[0]]} ({size(rows[fitting[0]].total)})" if fitting
                 else "none"))
        if not fitting:
            print(fixes(model, 3, n, precision, budget, args.gpus_per_node, tp))
    return 0


def table(rows: dict[int, StageBytes], budget: float, params: float) -> str:
    head = ["stage", "params", "grads", "optimizer", "gathered", "activations", "total",
            "per param", "vs DDP", f"vs {size(budget)}"]
    lines = [head]
    ddp = rows[0].total if 0 in rows else None
    for stage, held in rows.items():
        over = held.total - budget
        lines.append([STAGE_NAMES[stage], *map(size, (held.params, held.grads, held.optimizer,
                                                      held.gathered, held.activations,
                                                      held.total)),
                      f"{held.total / params:.3g}P",
                      "-" if not ddp or stage == 0 else f"{held.total / ddp - 1:+.1%}",
                      "fits" if over <= 0 else f"over by {size(over)}"])
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) if i in (0, len(head) - 1) else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
                     for row in lines)


TYPICAL_LAYER_SHARE = 1 / 80  # one block of Llama-2-70B's 80 (GPT-3 175B: 1/96)


def layer_assumed_note(model: Model, n: int, precision: Precision) -> str:
    """What ZeRO-3's total leaves out when the largest layer was not given."""
    layer = model.params * TYPICAL_LAYER_SHARE
    extra = (precision.param + precision.grad) * layer
    total = model.at(3, n, precision).total
    return (f"gathered: --largest-layer not given, so L = 0 and ZeRO-3's total leaves out the "
            f"largest layer, which it gathers whole (its parameters and gradient: "
            f"{precision.param + precision.grad:g} bytes per parameter). A transformer block is "
            f"typically 1-2% of the model (one of Llama-2-70B's 80 is 1.2%): at 1/80, L = "
            f"{count_text(layer)} adds {size(extra)} per rank, {size(total + extra)} in all. "
            f"Give --largest-layer for your model.")


def precision_note(model: Model, stage: int, n: int, precision: Precision) -> str:
    fp32 = model.at(stage, n, PRECISIONS["fp32"]).total
    ours = model.at(stage, n, precision).total
    return (f"Against fp32 at {STAGE_NAMES[stage]}: {size(fp32)} -> {size(ours)}, "
            f"{1 - ours / fp32:.0%} less, not half: Adam's m and v stay fp32"
            + (" and the master copy is fp32 too." if precision.master else "."))


def deepspeed_note(model: Model, n: int, precision: Precision) -> str:
    """Our mixed-master accounting against DeepSpeed's estimators, and where they differ."""
    master = PRECISIONS["mixed-master"]
    p, layer = model.params, model.largest_layer
    ours2, ours3 = model.at(2, n, master), model.at(3, n, master)
    ds2, ds3 = deepspeed_estimate(2, p, n), deepspeed_estimate(3, p, n, layer)
    return (f"DeepSpeed's estimators (fp16 with fp32 master copy, model states only): "
            f"ZeRO-2 2P + 18P/N = {size(ds2 or 0.0)}, ZeRO-3 4L + 18P/N = {size(ds3 or 0.0)}; "
            f"ours in "
            f"mixed-master: ZeRO-2 2P + 14P/N = {size(ours2.total - ours2.activations)}, "
            f"ZeRO-3 4L + 16P/N = {size(ours3.total - ours3.activations)}. DeepSpeed also "
            f"holds the reduced gradient partition in fp32 for the optimiser (4 bytes per "
            f"partitioned parameter, {size(4 * p / n)} here): at ZeRO-2 on top of the fp16 "
            f"partition (+4P/N), at ZeRO-3 in its place (+2P/N). Both count the largest "
            f"layer's fp16 parameters and gradient (4L) at ZeRO-3.")


def fixes(model: Model, stage: int, n: int, precision: Precision, budget: float,
          per_node: int, tp: int = 1) -> str:
    """``n``: the data-parallel ranks; with tensor parallelism over ``tp`` each of them is
    ``tp`` GPUs, and rank counts are said in GPUs, whole nodes of ``per_node``."""
    held = model.at(stage, n, precision)
    lines = [f"{STAGE_NAMES[stage]} needs {size(held.total)} per rank, over {size(budget)} by "
             f"{size(held.total - budget)}. Fixes:"]
    higher = cheapest_fit(model, stage, n, precision, budget, max_world_size=n)
    if stage < 3:
        lines.append(f"  - a higher stage on {n * tp} ranks: " + (
            f"{STAGE_NAMES[higher.stage]} ({size(higher.bytes.total)} per rank)"
            if higher is not None else "none fits"))
    more = smallest_world_size(model, stage, precision, budget, start=n + 1)
    if more is None:
        lines.append(f"  - more ranks: none helps; the unsharded states alone exceed "
                     f"{size(budget)}")
    else:
        nodes = round_up(more, per_node // tp)
        line = (f"  - more ranks at {STAGE_NAMES[stage]}: {more * tp} ranks fit "
                f"({size(model.at(stage, more, precision).total)} per rank)")
        if nodes != more:
            line += (f"; in whole nodes of {per_node}: {nodes * tp} ranks "
                     f"({size(model.at(stage, nodes, precision).total)} per rank)")
        lines.append(line)
    states = held.total - held.activations
    if states <= budget:
        lines.append(f"  - activation checkpointing: fits if it brings activations from "
                     f"{size(held.activations)} down to {size(budget - states)} per rank")
    else:
        freed = (f"frees only the {size(held.activations)} of activations" if held.activations
                 else "frees activation memory only (none given: --activations-gb)")
        line = (f"  - activation checkpointing: recomputes activations in backward, so it "
                f"{freed}; the {size(states)} of model states stay, over {size(budget)} on "
                f"their own")
        if more is not None:
            nodes = round_up(more, per_node // tp)
            spare = budget - (model.at(stage, nodes, precision).total - held.activations)
            line += (f"; it pays once the states fit, e.g. on {nodes * tp} "
                     f"ranks, leaving {size(spare)} per rank for activations")
        lines.append(line)
    return "\n".join(wrap(line, "    ", first="") for line in lines)


def size(value: float) -> str:
    if value == 0:
        return "0"
    for unit, scale in (("GB", GB), ("MB", 1e6), ("KB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def count_text(params: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if params >= scale:
            return f"{params / scale:g}{unit}"
    return f"{params:g}"
