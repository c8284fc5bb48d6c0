"""A failure mode taught from code: the exercise's script with the bug, the fix as a
unified diff of it, and both run on real ranks, their verdicts side by side.

Everything shown is measured here and now: the two runs are the scripts as printed, on
fresh gloo ranks, judged by the same detectors as a user's run.
"""

from __future__ import annotations

import difflib
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from distdoctor.teaching.course import COURSE, Exercise
from distdoctor.teaching.grading import attempt_for
from distdoctor.teaching.runs import Run


@dataclass(frozen=True)
class CodeLesson:
    exercise: Exercise
    source: str  # the script with the bug
    diff: str  # the fix, as a unified diff of it
    world_size: int
    before: Run  # the script as it is
    after: Run  # with the fix


def has_code_lesson(name: str) -> bool:
    return any(e.name == name for e in COURSE)


def code_lesson(name: str, world_size: int, deadline: float) -> CodeLesson:
    """The lesson of exercise ``name``, both scripts run on ``world_size`` ranks."""
    exercise = next(e for e in COURSE if e.name == name)
    if exercise.nodes > 1 or exercise.program:  # runs as its exercise is graded
        world_size = exercise.world_sizes[0]
    source = exercise.source()
    fixed = source
    for edit in exercise.fix:
        fixed = edit.apply(fixed)
    diff = "".join(difflib.unified_diff(source.splitlines(keepends=True),
                                        fixed.splitlines(keepends=True),
                                        f"a/{exercise.script}", f"b/{exercise.script}"))
    with tempfile.TemporaryDirectory(prefix="distdoctor-lesson-") as folder:
        runs = []
        for label, text in (("bug", source), ("fixed", fixed)):
            (Path(folder) / label).mkdir()
            script = Path(folder) / label / exercise.script
            script.write_text(text)
            ran = attempt_for(exercise)(script, world_size, deadline)
            here = f"{script.parent}/"  # the scripts' lines said by name, as printed
            runs.append(replace(ran, causes=tuple((kind, summary.replace(here, ""))
                                                  for kind, summary in ran.causes)))
    return CodeLesson(exercise, source, diff, world_size, runs[0], runs[1])
