"""``distdoctor faults``: the catalogue; and a fault and variant looked up from what the
user typed, for ``diagnose`` and ``demo``, with a one-line error when there is none."""

from __future__ import annotations

import argparse

from distdoctor.cli.args import UsageError
from distdoctor.text import wrap


def add_commands(commands) -> None:
    listing = commands.add_parser("faults", help="list the fault catalogue",
                                  description="Every failure mode distdoctor can inject.")
    listing.set_defaults(handler=faults_command)


def fault_named(fault_id: str):
    from distdoctor import faults

    try:
        return faults.get(fault_id)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def check_variant(fault, variant: str | None) -> None:
    try:
        fault.variant(variant)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def check_world_size(fault, world_size: int) -> None:
    if world_size < fault.min_world_size:
        raise UsageError(f"{fault.id} needs at least {fault.min_world_size} ranks to show "
                         f"(--world-size {fault.min_world_size}), got {world_size}")


def faults_command(args: argparse.Namespace) -> int:
    from distdoctor import faults
    from distdoctor.cli.tables import changes_text

    catalogue = faults.catalogue()
    print(f"distdoctor fault catalogue: {len(catalogue)} failure modes\n")
    for fault in catalogue.values():
        print(f"{fault.id}: {fault.title}")
        print(f"  strategies: {', '.join(fault.strategies)}"
              + (f" (at least {fault.min_world_size} ranks)" if fault.min_world_size > 1 else ""))
        for strategy, why in fault.masked_by.items():
            print(wrap(f"masked on {strategy}: {why}", "  "))
        for strategy, why in fault.excluded.items():
            print(wrap(f"does not apply to {strategy}: {why}", "  "))
        for variant in fault.variants:
            print(wrap(f"variant {variant.name}: {variant.description} "
                       f"({changes_text(variant.knobs)})", "  "))
        for label in ("symptom", "cause", "fix"):
            print(wrap(f"{label}: {getattr(fault, label)}", "  "))
        print(wrap("in your own run: " + (", ".join(fault.reported_as) if fault.reported_as
                                          else "shown by the built-in workload only"), "  "))
        print()
    return 0
