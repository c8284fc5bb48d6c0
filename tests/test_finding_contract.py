"""The finding contract: the report and the pictures read a finding's ``kind``,
``first_step`` and ``where``, set by the check itself, never the names inside its
``measured`` numbers. Shown by running the real command on scripts with silent bugs twice,
once as is and once with every ``measured`` key renamed, and comparing what a user reads.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from distdoctor import checks
from distdoctor.models import Finding

pytestmark = pytest.mark.tier("e2e")


def renamed(finding: Finding) -> Finding:
    return dataclasses.replace(finding, measured={f"renamed_{key}": value
                                                  for key, value in finding.measured.items()})


def _same_but_timings(text: str) -> str:
    """The text but its timings and the page's own file name (before.html, after.html)."""
    return re.sub(r"\d+\.\d+ s\b", "<s>", text).replace("after.html", "before.html")


# scripts whose silent bugs reach the report through checks that set each field: where
# (the sum's all-reduce, the backward), first_step (divergence at step 1, NaN at step 3,
# the tensor-parallel layer's first step), several findings at once (NaN, then its spread)
SCRIPTS = [("summed_gradients.py", 3), ("own_seed_no_broadcast.py", 2),
           ("nan_in_one_shard.py", 2), ("tp_partial_output.py", 2)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("script, ranks", SCRIPTS)
def test_renaming_measured_keys_changes_nothing_a_user_reads(distdoctor, monkeypatch, tmp_path,
                                                            script, ranks):
    before = distdoctor("run", "--nproc-per-node", str(ranks), "--html",
                        str(tmp_path / "before.html"), script)
    assert before.returncode == 1, before.stdout + before.stderr  # a bug is named
    run_all = checks.run_all
    monkeypatch.setattr(checks, "run_all", lambda record: tuple(map(renamed, run_all(record))))
    after = distdoctor("run", "--nproc-per-node", str(ranks), "--html",
                       str(tmp_path / "after.html"), script)
    assert _same_but_timings(after.stdout) == _same_but_timings(before.stdout)
    marks = [re.findall(r"from step \d+", (tmp_path / name).read_text())
             for name in ("before.html", "after.html")]
    assert marks[0] == marks[1]


def test_a_renamed_key_really_is_gone_from_the_finding():
    """The comparison above can fail: renaming reaches the finding's numbers."""
    found = Finding(check="c", fault="f", symptom="s", cause="c", fix="f", fix_changes={},
                    measured={"first_step": 3, "where": "x.py:1"}, kind="non-finite",
                    first_step=3, where=("x.py:1",))
    assert renamed(found).measured == {"renamed_first_step": 3, "renamed_where": "x.py:1"}
    assert (renamed(found).first_step, renamed(found).where) == (3, ("x.py:1",))


def test_every_cause_kind_has_its_place_in_the_report():
    """A kind the report does not order would be set by a check and never shown."""
    from typing import get_args

    from distdoctor.models import CauseKind
    from distdoctor.userjob.reporting.report import BEFORE_ANY_RANK, NAMED_ORDER, SILENT_ORDER

    placed = set(NAMED_ORDER) | set(SILENT_ORDER) | set(BEFORE_ANY_RANK) | {
        "rank-crashed", "hang-unknown"}
    assert placed == set(get_args(CauseKind))
