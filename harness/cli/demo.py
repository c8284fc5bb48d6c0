"""``distdoctor demo FAULT | --all``: diagnose each fault and tell it as a lesson (the
lessons' text is ``distdoctor.cli.lessons``), then, with --all, sweep every variant on every
strategy and print one summary table."""

from __future__ import annotations

import argparse
import os
import sys
import time
from html import escape

from distdoctor.cli.args import (
    EVERY_STRATEGY,
    EVERY_STRATEGY_TEXT,
    UsageError,
    html_folder,
    run_options,
    spec_from,
)
from distdoctor.cli.faults import check_variant, check_world_size, fault_named


def add_commands(commands) -> None:
    demo = commands.add_parser(
        "demo", parents=[run_options(4)],
        help="show a failure mode as a short lesson, or all of them",
        description="Each fault as a narrated lesson: what goes wrong, what was measured, "
                    "why, the fix, and the numbers after it. With --all, every fault, then "
                    "one summary table over every variant and strategy.")
    which = demo.add_mutually_exclusive_group(required=True)
    which.add_argument("fault", nargs="?", metavar="FAULT",
                       help="a fault id, or an exercise taught from code alone (a cause "
                            "only a user's script shows, e.g. world-size-mismatch)")
    which.add_argument("--all", action="store_true", help="every fault in the catalogue")
    demo.add_argument("--strategy", choices=EVERY_STRATEGY, metavar="STRATEGY",
                      help="strategy for the lesson (default: the first that shows the "
                           "fault); with --all, every fault that applies to it, on it "
                           "alone; " + EVERY_STRATEGY_TEXT)
    demo.add_argument("--variant", metavar="NAME", help="the fault's variant (default: first)")
    demo.add_argument("--html", type=html_folder, metavar="DIR",
                      help="also write one self-contained HTML page per case into DIR, and "
                           "DIR/index.html listing them")
    demo.set_defaults(handler=demo_command)


def demo_command(args: argparse.Namespace) -> int:
    if args.all and args.variant:
        raise UsageError("--variant goes with one FAULT, not --all")
    if not args.all and _taught_from_code_only(args.fault):
        return _code_only_lesson(args)
    chosen = sweep_faults(args.strategy) if args.all else [fault_named(args.fault)]
    if args.all:  # a fault that cannot show on this many ranks is left out, and said so
        fewer = [f for f in chosen if args.world_size < f.min_world_size]
        chosen = [f for f in chosen if f not in fewer]
        for fault in fewer:
            print(f"({fault.id} needs at least {fault.min_world_size} ranks: left out at "
                  f"--world-size {args.world_size})")
        if not chosen:
            raise UsageError(f"no fault applies at --world-size {args.world_size}")
    else:
        check_world_size(chosen[0], args.world_size)
    for fault in chosen:
        check_variant(fault, args.variant)
        if args.strategy and args.strategy not in fault.strategies:
            raise UsageError(f"fault {fault.id} does not apply to {args.strategy}")
    from distdoctor.cli.lessons import (
        DemoRow,
        code_lesson_text,
        lesson,
        masked_note,
        summary_table,
    )
    from distdoctor.cli.tables import diagnosis_text
    from distdoctor.faultloop.diagnose import diagnose
    from distdoctor.teaching.lessons import code_lesson, has_code_lesson

    rows: list[DemoRow] = []
    taught = []  # the code lessons shown
    started = time.monotonic()

    def diagnosed(fault, strategy: str, variant: str | None) -> DemoRow:
        report, seconds = _timed(diagnose, fault, spec_from(args, strategy), variant)
        rows.append(DemoRow(fault.id, fault.variant(variant).name, strategy, args.world_size,
                            report, seconds))
        return rows[-1]

    for fault in chosen:
        if has_code_lesson(fault.id) and not args.strategy and not args.variant:
            taught.append(code_lesson(fault.id, args.world_size, args.deadline))
            print(code_lesson_text(taught[-1]) + "\n", flush=True)
        strategy = args.strategy or next(s for s in fault.strategies if fault.detectable_on(s))
        text = lesson(fault, diagnosed(fault, strategy, args.variant).report)
        for masked in fault.masked_by if not args.strategy else ():
            text += "\n" + masked_note(diagnosed(fault, masked, args.variant).report)
        print(text + "\n", flush=True)
    if args.all:
        todo = [case for case in sweep_cases(chosen, args.strategy)
                if not any((r.fault, r.variant, r.strategy) == (case[0].id, case[1].name, case[2])
                           for r in rows)]
        where = args.strategy or "every strategy"
        print(f"sweeping every variant on {where}: {len(todo)} more diagnoses ...", flush=True)
        for done, (fault, variant, strategy) in enumerate(todo, 1):
            row = diagnosed(fault, strategy, variant.name)
            _progress(f"[{done}/{len(todo)}] {fault.id} ({variant.name}) on {strategy}: "
                      f"{row.report.verdict.outcome} in {row.seconds:.1f} s")
        _progress("")
        rows.sort(key=lambda r: (r.fault, r.variant, r.strategy))
        print(summary_table(rows))
        print(f"{sum(map(_cured, taught))} of {len(taught)} lessons from code: the bug "
              f"shown and its fix verified on real ranks")
        print(f"wall time {time.monotonic() - started:.1f} s")
        for row in rows:  # a row that did not pass says why, in full
            if not row.report.verdict.passed:
                print(f"\n== did not pass: {row.fault} ({row.variant}) on {row.strategy} ==\n"
                      + diagnosis_text(row.report))
    if args.html:
        _write_pages(args.html, rows, taught)
    for shown in taught:
        _say_if_not_cured(shown)
    code_ok = all(map(_cured, taught))
    return 0 if all(r.report.verdict.passed for r in rows) and code_ok else 1


def _taught_from_code_only(name: str) -> bool:
    """An exercise that is no fault of the built-in workload (a cause only a user's script
    shows: a group that never forms, a collective one rank skips): its lesson is its code."""
    from distdoctor import faults
    from distdoctor.teaching.lessons import has_code_lesson

    return name not in faults.catalogue() and has_code_lesson(name)


def _code_only_lesson(args: argparse.Namespace) -> int:
    from distdoctor.cli.lessons import code_lesson_text
    from distdoctor.teaching.lessons import code_lesson

    if args.strategy or args.variant:
        raise UsageError(f"{args.fault} is taught from code alone: --strategy and --variant "
                         f"choose how a fault is injected into the built-in workload")
    taught = code_lesson(args.fault, args.world_size, args.deadline)
    print(code_lesson_text(taught), flush=True)
    if args.html:
        _write_pages(args.html, [], [taught])
    _say_if_not_cured(taught)
    return 0 if _cured(taught) else 1


def _say_if_not_cured(taught) -> None:
    if not _cured(taught):
        print(f"\n== did not pass: {taught.exercise.name} from code ==\n"
              f"with the bug: {taught.before}\nfixed: {taught.after}")


def _cured(taught) -> bool:
    """A code lesson passes when its bug showed a cause and its fix ran clean (a timing
    judgement left open is not clean where it decides the exercise, as the grader has it)."""
    from distdoctor.teaching.grading import deciding

    after = taught.after
    return bool(taught.before.causes) and not after.causes \
        and not deciding(taught.exercise.name, after) and after.finished


def _write_pages(directory: str, rows: list, taught: list) -> None:
    """One page per case and per code lesson, and an index of them."""
    from distdoctor.cli.lessons import run_verdict
    from distdoctor.pictures import page, reports

    entries = []
    for lesson in taught:
        name = f"{lesson.exercise.name}-code.html"
        verdicts = page.table(["script", "verdict"], [
            ["with the bug", run_verdict(lesson.before, lesson.exercise)],
            ["fixed", run_verdict(lesson.after, lesson.exercise)]])
        page.write(os.path.join(directory, name), page.page(
            f"distdoctor demo: {lesson.exercise.name} from code", lesson.exercise.title, [
                page.Section("The script", "script", f"<pre>{escape(lesson.source)}</pre>"),
                page.Section("The fix", "fix", page.diff(lesson.diff)),
                page.Section(f"Both run on {lesson.exercise.ranks(lesson.world_size)}", "runs",
                             verdicts)]))
        entries.append((name, f"{lesson.exercise.name} from code",
                        "fixed" if _cured(lesson) else "not-fixed"))
    for row in rows:
        name = f"{row.fault}-{row.variant}-{row.strategy}.html"
        title = f"distdoctor demo: {row.fault} ({row.variant}) on {row.strategy}"
        page.write(os.path.join(directory, name), reports.diagnosis_page(row.report, title))
        entries.append((name, f"{row.fault} ({row.variant}) on {row.strategy}",
                        row.report.verdict.outcome))
    page.write(os.path.join(directory, "index.html"), reports.index_page(entries))
    print(f"wrote {len(entries)} pages and {os.path.join(directory, 'index.html')}")


def sweep_faults(strategy: str | None) -> list:
    """The faults ``demo --all`` covers: the catalogue, or those that apply to ``strategy``."""
    from distdoctor import faults

    every = list(faults.catalogue().values())
    if strategy is None:
        return every
    chosen = [fault for fault in every if strategy in fault.strategies]
    if not chosen:
        raise UsageError(f"no fault in the catalogue applies to {strategy}")
    return chosen


def sweep_cases(chosen: list, strategy: str | None) -> list[tuple]:
    """Every (fault, variant, strategy) the sweep diagnoses: each variant of each fault on
    ``strategy``, or on every strategy it applies to."""
    return [(fault, variant, on) for fault in chosen for variant in fault.variants
            for on in ([strategy] if strategy else fault.strategies)]


def _progress(text: str) -> None:
    """One self-overwriting status line on a terminal's stderr; nothing when redirected."""
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K" + text)
        sys.stderr.flush()


def _timed(fn, *args):
    start = time.monotonic()
    result = fn(*args)
    return result, time.monotonic() - start
