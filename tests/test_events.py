"""One schema of trace events and rank-job records (``distdoctor.models.events``): every
writer and reader in the package spells a kind through its constants, never as a bare
string, and a reader meeting a kind it does not know says so."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from distdoctor.models.events import EMITTED, TRACE_EVENTS, Emit, Ev
from distdoctor.trace.evidence import evidence_from_events

pytestmark = pytest.mark.tier("unit")

ROOT = Path(__file__).resolve().parent.parent


def _spelled_by_hand() -> list[str]:
    """Bare strings where an event kind is written or compared: ``write(ev="...")``,
    ``x.get("ev") == "..."``, ``ctx.emit(("...", ...))``."""
    found = []
    for path in sorted((ROOT / "harness").rglob("*.py")):
        if path.name == "events.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.keyword) and node.arg == "ev" \
                    and isinstance(node.value, ast.Constant):
                found.append(f"{where} ev={node.value.value!r}")
            elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Call) \
                    and isinstance(node.left.func, ast.Attribute) \
                    and node.left.func.attr == "get" and node.left.args \
                    and isinstance(node.left.args[0], ast.Constant) \
                    and node.left.args[0].value == "ev":
                found += [f"{where} compared with {c.value!r}" for c in node.comparators
                          if isinstance(c, ast.Constant)]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "emit" and node.args \
                    and isinstance(node.args[0], ast.Tuple) and node.args[0].elts \
                    and isinstance(node.args[0].elts[0], ast.Constant):
                found.append(f"{where} emit({node.args[0].elts[0].value!r}, ...)")
    return found


def test_every_kind_is_spelled_through_the_schema():
    assert _spelled_by_hand() == []


def test_the_schema_names_each_kind_once():
    kinds = [v for k, v in vars(Ev).items() if k.isupper()]
    tags = [v for k, v in vars(Emit).items() if k.isupper()]
    assert len(set(kinds)) == len(kinds) == len(TRACE_EVENTS)
    assert len(set(tags)) == len(tags) == len(EMITTED)


def test_a_record_no_reader_knows_is_an_error_not_dropped():
    with pytest.raises(ValueError, match="rank 0 recorded 'stepp', a kind no reader knows"):
        evidence_from_events(0, (("stepp", None),))
    assert evidence_from_events(0, ((Emit.HOLDS, "stage 1"),)).holds == "stage 1"
