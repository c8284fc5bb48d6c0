"""``distdoctor exercise``: the course of failure modes as code a student fixes.

``exercise list`` gives the course in order; ``exercise NAME DIR`` writes the exercise's
buggy script and its task into DIR; ``exercise check DIR`` runs the student's script on
real ranks at two world sizes and grades it with the detectors: passed, or not yet with
what is still wrong (never the answer), as text and as JSON.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from distdoctor.cli.args import UsageError, seconds
from distdoctor.models.deadlines import IN_RANK_S

GRADE = "grade.json"


def add_commands(commands) -> None:
    exercise = commands.add_parser(
        "exercise", help="exercises: a buggy script to fix, graded on real ranks",
        usage="distdoctor exercise list\n"
              "       distdoctor exercise NAME DIR\n"
              "       distdoctor exercise check [--json PATH] DIR",
        description="Learn each failure mode by fixing it. `exercise list` gives the course "
                    "in order. `exercise NAME DIR` writes the exercise's script (train.py) "
                    "and its task (TASK.md) into DIR. Edit train.py (or launch.sh, where the "
                    "bug is in how the nodes are started), then `exercise check "
                    "DIR` runs it on 2 and then 3 gloo ranks and grades it with the "
                    "detectors: passed (every rank finished, no cause found at either world "
                    "size), or not yet, with what is still wrong; undecided where a timing "
                    "judgement (a straggler) could not be made with a margin on a busy "
                    "machine. It writes the grade as "
                    f"JSON to DIR/{GRADE} (or --json PATH) for a grading script. Exit 0 "
                    "passed, 1 not yet or undecided, 2 bad input.")
    exercise.add_argument("what", metavar="list | check | NAME",
                          help="list the course, check DIR, or start exercise NAME in DIR")
    exercise.add_argument("directory", nargs="?", metavar="DIR",
                          help="the exercise's folder")
    exercise.add_argument("--json", metavar="PATH",
                          help=f"where the grade's JSON goes (default DIR/{GRADE})")
    exercise.add_argument("--deadline", type=seconds, default=IN_RANK_S, metavar="SECONDS",
                          help="each run's deadline (default %(default)s)")
    exercise.set_defaults(handler=exercise_command)


def exercise_command(args: argparse.Namespace) -> int:
    from distdoctor.teaching.course import COURSE

    if args.what == "list":
        if args.directory:
            raise UsageError("exercise list takes no folder")
        for number, found in enumerate(COURSE, 1):
            print(f"{number:2}. {found.name}: {found.title}")
        print("\nstart one with `distdoctor exercise NAME DIR`; "
              "check it with `distdoctor exercise check DIR`")
        return 0
    if not args.directory:
        raise UsageError(f"exercise {args.what} needs a folder: distdoctor exercise "
                         f"{args.what} DIR")
    directory = Path(args.directory)
    if args.what == "check":
        return _check(directory, args)
    return _start(args.what, directory)


def _start(name: str, directory: Path) -> int:
    from distdoctor.teaching.course import COURSE
    from distdoctor.teaching.grading import TASK, start

    try:
        chosen = start(name, directory)
    except KeyError:
        raise UsageError(f"no exercise {name!r}; choose from "
                         f"{', '.join(e.name for e in COURSE)} (or list, check)") from None
    except FileExistsError as exc:
        raise UsageError(f"{exc.args[0]} exists: an attempt is kept, never written "
                         f"over; choose another folder") from None
    except OSError as exc:
        raise UsageError(f"cannot write the exercise into {directory}: {exc.strerror}") \
            from None
    print(f"wrote {directory / chosen.edited} and {directory / TASK}\n\n{chosen.task}\n\n"
          f"check your fix with: distdoctor exercise check {directory}")
    return 0


def _check(directory: Path, args: argparse.Namespace) -> int:
    from distdoctor.teaching.grading import NotAnExercise, grade, settings

    try:
        settings(directory)
    except NotAnExercise as exc:
        raise UsageError(str(exc)) from None
    result = grade(directory, args.deadline,
                   progress=lambda text: print(f"distdoctor exercise: {text}", flush=True))
    target = Path(args.json) if args.json else directory / GRADE
    try:
        result.write(target)
    except OSError as exc:
        raise UsageError(f"cannot write the grade to {target}: {exc.strerror}") from None
    print(f"distdoctor exercise: {result.exercise}: {result.message}")
    return 0 if result.passed else 1
