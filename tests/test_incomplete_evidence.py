"""Recorders fail loudly, jobs never: a recorder that raises leaves the user's step alone,
and the report says which evidence is incomplete, on which ranks, from which step, instead
of a clean bill of health. The failing recorder is real: the NaN/Inf check's gradient sums
raise in the ranks (forked from this process, so they inherit the patch)."""

from __future__ import annotations

import pytest

from distdoctor.models import Incomplete
from distdoctor.trace.evidence import fold_incomplete
from distdoctor.trace.sums import GradSums

pytestmark = pytest.mark.tier("e2e")


def _boom(self, p, grad):
    raise RuntimeError("boom")


def test_a_recorder_that_raises_is_named_and_the_job_finishes(distdoctor, monkeypatch):
    monkeypatch.setattr(GradSums, "add", _boom)
    done = distdoctor("run", "--nproc-per-node", "2", "clean.py", "4")
    assert done.returncode == 0, done.stdout + done.stderr  # the job itself is fine
    assert "distdoctor run: OK (from partial evidence): all 2 ranks of clean.py" in done.stdout
    assert ("evidence incomplete: NaN/Inf checks on ranks 0, 1 from step 1 "
            "(RuntimeError: boom)") in done.stdout
    # said once per rank on stderr too, not once per gradient
    assert done.stderr.count("cannot record NaN/Inf checks (RuntimeError: boom)") == 2


def test_a_clean_run_says_nothing_of_incomplete_evidence(distdoctor):
    done = distdoctor("run", "--nproc-per-node", "2", "clean.py", "4")
    assert done.returncode == 0
    assert "distdoctor run: OK: all 2 ranks" in done.stdout and "incomplete" not in done.stdout


def test_events_of_an_unknown_kind_are_reported_not_dropped():
    trace = ({"ev": "enter", "id": 1}, {"ev": "from_the_future", "x": 1},
             {"ev": "from_the_future"}, {"ev": "incomplete", "what": "gradient samples",
                                         "step": 12, "error": "RuntimeError: x"})
    assert fold_incomplete(trace) == (
        Incomplete("gradient samples", 12, "RuntimeError: x"),
        Incomplete("2 trace events of unknown kind 'from_the_future'", None,
                   "written by another version of distdoctor?"))
