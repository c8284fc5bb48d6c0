"""One name per failure mode: the catalogue's fault, its lesson and exercise, the report's
kind, the check's module and the docs all say the same word, so a student who ran
``demo sum-without-mean`` recognises ``FAILED: sum-without-mean`` in their own run. A kind
broader than one fault (a cycle of blocked sends, samples two ranks read) is the fault's
``reported_as``, and the catalogue's row says so. Each test fails when a name exists in one
place and not in another."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from distdoctor import checks, faults
from distdoctor.fixing.remedies import REMEDIES
from distdoctor.models.verdict import CAUSE_KINDS, RESUME_CAUSES
from distdoctor.teaching.course import COURSE
from distdoctor.teaching.grading import DROPOUT_REMOVED, OPTIMIZER_CHANGED
from distdoctor.teaching.launched import NOT_ONE_JOB
from distdoctor.userjob.reporting.report import BEFORE_ANY_RANK

pytestmark = pytest.mark.tier("unit")

DOCS = Path(__file__).resolve().parents[1] / "docs"
CATALOGUE = faults.catalogue()
TOLD = set(CAUSE_KINDS) | set(RESUME_CAUSES)  # what a run's report or resume-check says


def _module_name(name: str) -> str:
    return name.replace("-", "_")


def _modules() -> dict[str, object]:
    return {module.__name__.rsplit(".", 1)[1]: module for module in checks.detectors()}


def _families() -> dict[str, tuple[str, ...]]:
    """The check modules that tell several kinds apart (a stopped run's causes, a group
    that never formed), by the kinds each declares."""
    return {name: module.KINDS for name, module in _modules().items()
            if hasattr(module, "KINDS")}


def test_each_check_is_named_by_its_module_and_the_module_by_a_failure_mode():
    for name, module in _modules().items():
        assert module.NAME == name
        dashed = name.replace("_", "-")
        assert dashed in CATALOGUE or dashed in TOLD or name in _families(), \
            f"checks/{name}.py names no fault of the catalogue and no kind of the report"


def test_each_fault_has_a_check_of_its_name_or_of_the_kind_it_is_reported_as():
    modules = _modules()
    for fault in CATALOGUE.values():
        homes = [_module_name(fault.id)] + [_module_name(k) for k in fault.reported_as]
        homes += [family for family, kinds in _families().items()
                  if set(fault.reported_as) & set(kinds)]
        assert any(home in modules for home in homes), f"no check for {fault.id}"


def test_a_fault_that_is_a_kind_is_reported_as_itself_and_only_as_kinds():
    for fault in CATALOGUE.values():
        assert set(fault.reported_as) <= TOLD, fault.id
        if fault.id in TOLD:
            assert fault.id in fault.reported_as, fault.id


def test_every_kind_has_one_home_among_the_checks():
    """A kind is a check module's name, a family's declared kind, the broader kind of a
    fault whose module has the fault's name, or named before any rank exists."""
    modules = _modules()
    homed = {name.replace("_", "-") for name in modules}
    homed |= {kind for kinds in _families().values() for kind in kinds}
    homed |= {kind for fault in CATALOGUE.values() if _module_name(fault.id) in modules
              for kind in fault.reported_as}
    homed |= set(BEFORE_ANY_RANK)
    assert set(CAUSE_KINDS) - homed == set()


def test_every_kind_and_fault_is_in_the_docs_and_each_catalogue_row_names_its_kinds():
    run = (DOCS / "run.md").read_text()
    for kind in CAUSE_KINDS:
        assert f"| `{kind}`" in run, f"docs/run.md's table of causes lacks {kind}"
    rows = {m.group(1): m.group(0) for m in
            re.finditer(r"^\| `([a-z0-9-]+)` \|.*$", (DOCS / "catalogue.md").read_text(),
                        re.MULTILINE)}
    assert set(rows) == set(CATALOGUE)
    for fault in CATALOGUE.values():  # the last column: the kinds a user's run is told
        last = rows[fault.id].rstrip(" |").rsplit(" | ", 1)[1]
        assert tuple(re.findall(r"`([a-z0-9-]+)`", last)) == fault.reported_as, fault.id


def test_exercises_and_remedies_use_the_names_of_the_catalogue_and_the_report():
    for exercise in COURSE:
        assert exercise.name in CATALOGUE or exercise.name in TOLD, exercise.name
        assert set(exercise.kinds) <= TOLD, exercise.name
        if exercise.name in CATALOGUE:
            assert set(exercise.kinds) <= set(CATALOGUE[exercise.name].reported_as)
        for wrong in exercise.wrong_fixes:
            # or the grader's own word for a task not done (the optimiser it keeps dropped,
            # the nodes' ranks not one job, its dropout removed)
            assert wrong.still in TOLD | {OPTIMIZER_CHANGED, NOT_ONE_JOB, DROPOUT_REMOVED}, (
                exercise.name, wrong.name)
    assert set(REMEDIES) <= set(CAUSE_KINDS)
    assert not set(CAUSE_KINDS) & set(RESUME_CAUSES)  # a name says which tool told it


def test_each_row_of_the_readmes_symptom_table_names_its_failure_modes():
    """Each symptom a user looks up leads to one name: a fault's lesson or a cause kind,
    and every fault of the catalogue has its row."""
    readme = (DOCS.parent / "README.md").read_text()
    table = readme[readme.index("| Symptom | Cause | Fix |"):]
    rows = table[:table.index("\n\n")].splitlines()[2:]
    named = set()
    for row in rows:
        names = re.findall(r"`([a-z0-9-]+)`", row.rstrip(" |").rsplit(" | ", 1)[1])
        assert names, row
        named |= set(names)
    assert named <= set(CATALOGUE) | TOLD
    assert set(CATALOGUE) <= named


def _kind_literals(path: Path) -> set[str]:
    """Every string in a module's code that is a cause kind, the KINDS table itself aside."""
    import ast

    tree = ast.parse(path.read_text())
    table = {id(node) for statement in tree.body if isinstance(statement, ast.AnnAssign)
             and getattr(statement.target, "id", "") == "KINDS"
             for node in ast.walk(statement)}
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and node.value in CAUSE_KINDS
            and id(node) not in table}


def test_a_family_declares_every_kind_its_code_names():
    """A family check's KINDS (what tests/test_names.py reads) cannot drift from the kinds
    it emits: every cause kind written in its module, or in the analysis module it reads
    its findings from, is declared."""
    import ast
    import importlib.util

    for name, kinds in _families().items():
        module = _modules()[name]
        sources = [Path(module.__file__)]
        for node in ast.walk(ast.parse(sources[0].read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "distdoctor.analysis."):
                spec = importlib.util.find_spec(node.module)
                assert spec is not None and spec.origin is not None
                sources.append(Path(spec.origin))
        named = set().union(*map(_kind_literals, sources))
        assert named, f"checks/{name}.py names no kind at all: the scan found nothing"
        assert named <= set(kinds), (name, sorted(named - set(kinds)))
