"""Grade a student's attempt: their script run on real ranks at each of the course's world
sizes, every detector on it, and the verdict in the detectors' words.

Passed means every run finished with no cause found at every world size. Not yet says
what is still wrong (the first cause's summary, at the world size it showed), never the
fix: the student finds that. The grade is also written as JSON, for a grading script.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from distdoctor.models.deadlines import IN_RANK_S
from distdoctor.models.jsoncodec import to_json
from distdoctor.teaching.course import SCRIPT, Exercise, exercise
from distdoctor.teaching.runs import Run

GRADE_SCHEMA = "distdoctor.exercise.v1"
SETTINGS = "exercise.json"  # what `exercise FAULT DIR` wrote: which exercise, which script
TASK = "TASK.md"
# the cause a graded run is given where it fits its memory budget by keeping less optimiser
# state than the task says to keep: not a failure mode of training, a task not done
OPTIMIZER_CHANGED = "optimizer-changed"
# the cause a graded run is given where fewer of its dropout layers drop than the task keeps
DROPOUT_REMOVED = "dropout-removed"


class NotAnExercise(ValueError):
    """The folder holds no exercise, or not the script it names."""


def kind_of(undecided: str) -> str:
    """The failure mode an open timing judgement is about: its text begins with it
    ("straggler (rank 0): ...", as the report says it)."""
    return undecided.split(" ", 1)[0]


def deciding(name: str, run: Run) -> tuple[str, ...]:
    """The timing judgements left open in ``run`` that decide an attempt at exercise
    ``name``: every one in an exercise about time (a straggler, unbalanced stages), none
    elsewhere, where an open judgement is no cause found and a correct fix is not held back
    because the machine was loaded. The grade, the lesson's verdict and ``demo`` ask this."""
    from distdoctor import checks

    return run.undecided if checks.judges_time(name) else ()


@dataclass(frozen=True)
class Grade:
    exercise: str
    script: str
    passed: bool
    message: str
    runs: tuple[Run, ...]
    schema: str = GRADE_SCHEMA

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(to_json(self), indent=1) + "\n")


def start(name: str, directory: Path) -> Exercise:
    """Write exercise ``name`` into ``directory``: its script, its task, and which exercise
    it is (what ``settings`` reads back). Raises KeyError for an unknown name, FileExistsError
    where an attempt is already there (never written over), OSError where it cannot write."""
    chosen = exercise(name)
    for kept in dict.fromkeys((chosen.edited, SCRIPT)):  # the student's file named first
        if (directory / kept).exists():
            raise FileExistsError(directory / kept)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / chosen.edited).write_text(chosen.source())
    if chosen.program:
        (directory / SCRIPT).write_text(chosen.program_source())
    how = ("three times on each (stopped after its first checkpoint, once through, and "
           "resumed from that checkpoint), compares the resumed run with the one never "
           "stopped," if chosen.resumes else "and")
    (directory / TASK).write_text(
        f"# {chosen.title}\n\n{chosen.task}\n\nEdit {chosen.edited}, then run\n\n"
        f"    distdoctor exercise check {directory}\n\nIt runs your script on "
        f"{chosen.ranks(*chosen.world_sizes)}"
        f"{',' if chosen.nodes > 1 or chosen.memory_budget or chosen.program else ''} {how} "
        f"says passed, or what is still wrong.\n")
    (directory / SETTINGS).write_text(json.dumps({"exercise": name,
                                                  "script": chosen.edited}) + "\n")
    return chosen


def settings(directory: Path) -> tuple[str, Path]:
    """The exercise's name and the student's script, as the folder says."""
    try:
        said = json.loads((directory / SETTINGS).read_text())
        name, script = str(said["exercise"]), directory / str(said["script"])
        exercise(name)
    except (OSError, ValueError, KeyError, TypeError):
        raise NotAnExercise(f"{directory} holds no exercise ({SETTINGS} is missing or not "
                            f"one distdoctor wrote): start one with `distdoctor exercise "
                            f"NAME {directory}`") from None
    if not script.is_file():
        raise NotAnExercise(f"{script} is missing: the exercise's script is graded there")
    return name, script


def grade(directory: Path, deadline: float = IN_RANK_S, progress=print) -> Grade:
    """The attempt in ``directory``, graded. A timing judgement a busy machine left open
    decides the grade (undecided) only where ``deciding`` says so; a pass says it was left
    open."""
    name, script = settings(directory)
    chosen = exercise(name)
    attempt = attempt_for(chosen)
    runs = []
    for world_size in chosen.world_sizes:
        progress(f"running {script.name} on {world_size} ranks ...")
        runs.append(attempt(script, world_size, deadline))
        if runs[-1].causes or deciding(name, runs[-1]) or not runs[-1].finished:
            break  # what is still wrong, at the first world size that shows it
    last = runs[-1]
    if not last.causes and last.finished and deciding(name, last):
        return Grade(name, str(script), False, f"undecided: on {last.world_size} ranks, "
                     f"{deciding(name, last)[0]}; the machine was too busy to judge this with a "
                     f"margin: check again when it is quieter", tuple(runs))
    if not last.causes and last.finished:
        sizes = " and ".join(str(r.world_size) for r in runs)
        clean = "every rank finished and no detector found a cause" + (
            ", and resumed from its checkpoint it trains like the run that never stopped"
            if chosen.resumes else "")
        left_open = [text for run in runs for text in run.undecided]
        if left_open:
            clean += open_note(left_open[0])
        return Grade(name, str(script), True, f"passed: {script.name} runs clean on {sizes} "
                     f"ranks: {clean}", tuple(runs))
    said = last.causes[0][1] if last.causes else "a rank did not finish"
    return Grade(name, str(script), False, f"not yet: on {last.world_size} ranks, {said}",
                 tuple(runs))


def open_note(undecided: str) -> str:
    """What a pass adds for a timing judgement left open that does not decide it."""
    return (f" (the busy machine left a timing judgement open, {kind_of(undecided)}: not "
            f"what this exercise is about)")


def attempt_for(chosen: Exercise) -> Callable[[Path, int, float], Run]:
    """How an attempt at ``chosen`` is run and judged: by resume-check where the bug is in
    the resume, from its launch script where the bug is in how the nodes start, else by
    every detector on one run; each under the exercise's memory budget where it has one
    (as a device's memory would bound it), and held to what the task keeps."""
    how: Callable[[Path, int, float], Run]
    if chosen.resumes:
        how = resume_attempt
    elif chosen.program:
        from distdoctor.teaching.launched import launch_attempt

        how = functools.partial(launch_attempt, chosen)
    else:
        how = functools.partial(run_attempt, nodes=chosen.nodes)

    def attempt(script: Path, world_size: int, deadline: float) -> Run:
        from distdoctor.userjob.launching.budget import memory_budget

        with memory_budget(chosen.memory_budget):
            return held_to_task(chosen, how(script, world_size, deadline))

    return attempt


def held_to_task(chosen: Exercise, run: Run) -> Run:
    """A clean run that got there by dropping what the task keeps has not done the task:
    the first thing it dropped is its cause (``TASK_KEEPS``)."""
    if run.causes or not run.finished:
        return run
    for dropped in TASK_KEEPS:
        cause = dropped(chosen, run)
        if cause is not None:
            return dataclasses.replace(run, causes=(cause,))
    return run


def _optimizer_dropped(chosen: Exercise, run: Run) -> tuple[str, str] | None:
    """A run that fits its budget by holding less optimiser state than the task keeps
    (plain SGD for Adam): the budget is met by partitioning the state, not dropping it."""
    need, held = chosen.state_per_parameter, run.state_per_parameter
    if not need or (held is not None and held >= need):
        return None
    measured = ("no optimiser state was measured" if held is None else
                f"the optimiser state all ranks hold together is {held:.3g} bytes per "
                f"parameter")
    return (OPTIMIZER_CHANGED, (
        f"{measured}, where the optimiser the task keeps holds {need:g}: the state fits "
        f"the budget by being smaller, not by being held differently; keep the optimiser "
        f"and find where each rank's copy of its state can go"))


def _dropout_dropped(chosen: Exercise, run: Run) -> tuple[str, str] | None:
    """Fewer of the model's dropout layers drop on every rank than the task keeps: ranks
    agree without dropout, which is no fix of how it draws its masks."""
    if len(run.dropouts) >= chosen.dropouts:
        return None
    seen = ", ".join(run.dropouts) or "none"
    return (DROPOUT_REMOVED, (
        f"{len(run.dropouts)} of the model's {chosen.dropouts} dropout layers drop values in "
        f"training on every rank (seen dropping: {seen}): the task keeps the model's "
        f"dropout and changes how its masks are drawn"))


# what a task keeps that a run may drop to pass: each says what was dropped, or None
TASK_KEEPS: tuple[Callable[[Exercise, Run], tuple[str, str] | None], ...] = (
    _optimizer_dropped, _dropout_dropped)


def resume_attempt(script: Path, world_size: int, deadline: float) -> Run:
    """``script`` on ``world_size`` ranks as resume-check runs it: stopped after its first
    checkpoint, once through, resumed. The run once through is judged by every detector
    as a plain run is (a fix that resumes alike but breaks training, a sampler told a
    constant epoch, is no fix), then the first thing the resumed run does otherwise."""
    from distdoctor.userjob.resuming.runs import (
        CannotCompare,
        own_folder,
        resumption,
        said_at_home,
        script_runs,
    )

    script = script.resolve()
    judged: list[Run] = []
    runs = script_runs(script, [], world_size, deadline, script.parent,
                       judge=lambda finished, causes: judged.append(
                           Run(world_size, finished, causes)))
    found, why = None, ""
    try:
        found = resumption(runs, script.name, script.parent)
    except CannotCompare as exc:
        why = str(exc)
    if not judged:  # it failed before the run once through: a plain run says how
        with own_folder(script.parent) as folder:
            plain = run_attempt(folder / script.name, world_size, deadline)
        judged.append(Run(world_size, plain.finished, tuple(
            (kind, said_at_home(said, (folder,), script.parent)) for kind, said in plain.causes)))
    if judged[0].causes or not judged[0].finished:
        return judged[0]
    if found is None:
        return Run(world_size, False, (("not-compared", why),))
    if found.ok:
        return Run(world_size, True, ())
    return Run(world_size, found.kind != "not-deterministic", ((found.kind, found.summary),))


def run_attempt(script: Path, world_size: int, deadline: float, nodes: int = 1) -> Run:
    """``script`` on ``world_size`` fresh gloo ranks, judged by every detector. A timing
    alarm (a stage that gates the pipeline) stands only when a second run raises it too,
    and goes when quiet runs outnumber it (``analysis.votes``): one run's steps share
    their luck on a loaded machine."""
    from distdoctor import checks
    from distdoctor.analysis.votes import until_settled

    def alarm(run: Run) -> tuple[tuple[str, str], ...] | None:
        if any(checks.confirmed_by_a_second_run(kind_of(text)) for text in run.undecided):
            return None
        return tuple(c for c in run.causes if checks.confirmed_by_a_second_run(c[0]))

    last, _ = until_settled(lambda _: run_once(script, world_size, deadline, nodes), alarm,
                            lambda run: run.finished)
    return last  # of three runs, two agree; an undecided one says so itself


def run_once(script: Path, world_size: int, deadline: float, nodes: int = 1) -> Run:
    """``script`` on ``world_size`` fresh gloo ranks (numbered as ``nodes`` nodes'), judged
    by every detector, once."""
    from distdoctor.launch import procs
    from distdoctor.userjob.launching.launcher import run_script
    from distdoctor.userjob.reporting.record import explain, script_record

    try:
        result = run_script(str(script), [], world_size, deadline, echo=False, nodes=nodes)
    finally:
        procs.wait_reaped()
    record = script_record(result.ends, result.traces, result.wall_s, result.started,
                           deadline)
    report = explain(record, str(script))
    finished = all(end.status == "finished" for end in result.ends)
    dropping = [set(r.evidence.dropouts) for r in record.ranks]
    return Run(world_size, finished, tuple((c.kind, c.summary) for c in report.findings),
               tuple(report.undecided), _state_per_parameter(record),
               tuple(sorted(set.intersection(*dropping))) if dropping else ())


def _state_per_parameter(record) -> float | None:
    """Bytes of optimiser state over all ranks per parameter element at the first step
    they measured, where they measured their training state (under a memory budget). A
    ZeroRedundancyOptimizer's step counts as two optimiser steps (its own, and its inner
    optimiser's within it), so its first measured step is numbered 2."""
    from distdoctor.checks.over_memory_budget import whole_optimizer_state

    state = whole_optimizer_state(record)
    first = next((m for r in record.ranks for m in r.evidence.memory), None)
    if state is None or first is None or not first.model_params:
        return None
    return state / first.model_params
