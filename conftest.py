"""Shared fixtures: warm rank pools, so no test pays for a process group of its own.

Hypothesis runs under the "ci" profile: the same examples every run (derandomized), so a
red suite is never bad luck. ``--hypothesis-profile=explore`` searches further: fresh
random examples every run and ten times as many; ``make soak`` runs it.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, max_examples=100)
settings.register_profile("explore", derandomize=False, max_examples=1000, database=None)
settings.load_profile("ci")  # --hypothesis-profile, read later, overrides it


@pytest.fixture(scope="session")
def pools():
    """``pools(n)``: the session's warm n-rank gloo pool (re-formed if a job broke it)."""
    from harness.launch.pool import shared_pool

    return shared_pool


@pytest.fixture
def private_tmp(tmp_path):
    """(env, tmpdir): an environment whose TMPDIR is a fresh empty directory, for tests that
    assert a child process leaves nothing there. torch's persistent inductor cache goes
    elsewhere: importing torch._inductor creates it under TMPDIR unless
    TORCHINDUCTOR_CACHE_DIR is set (and sets it, so whether a child inherits it would
    depend on which tests ran before)."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = dict(os.environ, TMPDIR=str(tmpdir),
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor-cache"))
    return env, tmpdir


@pytest.fixture
def cpu_hog():
    """A busy-looping process on every core for the test's duration (each one also ends by
    itself after two minutes), as on a CI machine that runs other jobs alongside."""
    import signal
    import subprocess
    import sys

    code = ("import time\nend = time.monotonic() + 120\n"
            "while time.monotonic() < end: pass\n")
    hogs = [subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
            for _ in range(os.cpu_count() or 1)]
    try:
        yield len(hogs)
    finally:
        for hog in hogs:
            os.killpg(hog.pid, signal.SIGKILL)
            hog.wait()
