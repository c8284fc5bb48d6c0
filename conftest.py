"""Shared fixtures: warm rank pools, so no test pays for a process group of its own.

Hypothesis runs under the "ci" profile: the same examples every run (derandomized), so a
red suite is never bad luck. ``--hypothesis-profile=explore`` searches further: fresh
random examples every run and ten times as many; ``make soak`` runs it.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, max_examples=100)
settings.register_profile("explore", derandomize=False, max_examples=1000, database=None)
settings.load_profile("ci")  # --hypothesis-profile, read later, overrides it


@pytest.fixture(scope="session")
def pools():
    """``pools(n)``: the session's warm n-rank gloo pool (re-formed if a job broke it)."""
    from distdoctor.launch.pool import shared_pool

    return shared_pool


EXAMPLES = Path(__file__).parent / "examples"


@dataclass(frozen=True)
class Done:
    """What one ``distdoctor`` command did: its exit code and what it (and its ranks) wrote."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def distdoctor(capfd, monkeypatch):
    """``distdoctor(*args)``: the command run in this process, from the examples folder,
    with what it and its ranks wrote to fds 1 and 2. In-process, the ranks are this
    process's own children, so one left running would show in the process table (a
    child process's leaked ranks would be reparented to init, out of sight), and no test
    pays for a second interpreter importing torch."""
    import proctable  # tests/, on the path once a test module is collected

    from distdoctor.cli.main import main

    monkeypatch.chdir(EXAMPLES)

    def command(*args: str) -> Done:
        before = proctable.children()
        capfd.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code
        out, err = capfd.readouterr()
        assert proctable.children() == before
        return Done(code, out, err)

    return command


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


# Tiers: every test module says which one it is in (``pytestmark = pytest.mark.tier(...)``;
# a test may say otherwise for itself, the closest mark wins). ``--tier unit`` is the quick
# loop ``make check`` runs before each commit.
TIERS = {
    "unit": "in this process only: no rank, no fresh interpreter",
    "warm": "on the session's warm rank pools (started once, shared by every test)",
    "e2e": "starts fresh interpreters of its own: distdoctor run, torchrun, pytest, benches",
}


def pytest_addoption(parser):
    parser.addoption("--tier", action="append", choices=sorted(TIERS), default=[],
                     help="run only the tests of this tier (repeatable): "
                          + "; ".join(f"{name}: {what}" for name, what in TIERS.items()))


@pytest.hookimpl(trylast=True)  # after pytest's tmp_path plugin is configured
def pytest_configure(config):
    _own_temporary_folder(config)
    config.addinivalue_line("markers", "tier(name): the test's tier, one of "
                            + ", ".join(TIERS) + " (conftest.py says what each means)")
    config.addinivalue_line("markers", "timing: the test judges how long ranks take (a "
                            "straggler's or a stage balance's verdict): run last, once the "
                            "background lanes are done (tests/lanes.py), not beside them")


def _own_temporary_folder(config) -> None:
    """Every process the suite starts writes its temporary files into one folder of the
    session's, removed when the session ends: torch's own torchrun leaves its
    torchelastic_* folder behind (measured: after a clean 2-rank run too), and
    multiprocessing's pymp-* folder stays when a process leaves by os._exit (our ranks
    do, by design). pytest's own folders (tmp_path) stay where pytest keeps them, its last
    three runs for a look after a failure: their base is fixed before TMPDIR moves."""
    import tempfile

    factory = getattr(config, "_tmp_path_factory", None)
    if factory is None or os.environ.get("PYTEST_XDIST_WORKER"):
        return  # no tmp_path plugin to pin (-p no:tmpdir), or xdist's controller did it
    factory.getbasetemp()
    # short: a unix socket's path (multiprocessing's listener) must fit in 107 bytes
    own = tempfile.mkdtemp(prefix="dd-")
    os.environ["TMPDIR"], tempfile.tempdir = own, own
    config.add_cleanup(lambda: shutil.rmtree(own, ignore_errors=True))


def tier_of(item) -> str | None:
    mark = item.get_closest_marker("tier")
    return mark.args[0] if mark is not None and mark.args else None


def pytest_collection_modifyitems(config, items):
    untiered = sorted({item.nodeid.split("::")[0] for item in items
                       if tier_of(item) not in TIERS})
    if untiered:
        raise pytest.UsageError("every test module says its tier (pytestmark = "
                                "pytest.mark.tier('unit' | 'warm' | 'e2e')): "
                                + ", ".join(untiered) + " do not")
    wanted = set(config.getoption("--tier"))
    if wanted:
        kept = [item for item in items if tier_of(item) in wanted]
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept
    # the tests reading background jobs last: the jobs run meanwhile (tests/lanes.py);
    # after them, on a machine the lanes no longer load, the tests that judge times
    items.sort(key=lambda item: (item.get_closest_marker("timing") is not None,
                                 "lanes" in getattr(item, "fixturenames", ())))


# Background lanes (tests/lanes.py): the jobs of the modules whose selected tests read them
# (through the ``lanes`` fixture), started once the collection is done, stopped and removed
# when the session ends. A module's unit tests alone start none (``make check``).
LANES = pytest.StashKey["object"]()


def pytest_collection_finish(session):
    modules = []
    for item in session.items:
        module = getattr(item, "module", None)
        if hasattr(module, "lane_jobs") and module not in modules and \
                "lanes" in getattr(item, "fixturenames", ()):
            modules.append(module)
    if not modules:
        return
    import tempfile

    import lanes
    import proctable

    # short folder names: a job's TMPDIR is under them, and multiprocessing's listener
    # socket there must fit a unix socket's 107 bytes (DataLoader workers hung without it)
    root = Path(tempfile.mkdtemp(prefix="dd-lanes-"))
    jobs = []
    for number, module in enumerate(modules):
        folder = root / str(number)
        folder.mkdir()
        jobs.extend(module.lane_jobs(folder))
    (root / "results").mkdir()
    session.config.stash[LANES] = started = lanes.Lanes(jobs, root / "results")
    proctable.BACKGROUND.add(started.runner.pid)
    session.config.add_cleanup(lambda: shutil.rmtree(root, ignore_errors=True))
    session.config.add_cleanup(started.close)


def pytest_terminal_summary(terminalreporter, config):
    """Beside pytest's slowest tests, the slowest background jobs (their time overlaps
    the tests', so it is not in the tests' durations)."""
    started = config.stash.get(LANES, None)
    if started is None:
        return
    terminalreporter.write_sep("=", "slowest 10 background jobs (tests/lanes.py)")
    for seconds, name in started.slowest(10):
        terminalreporter.write_line(f"{seconds:.2f}s {name}")


@pytest.fixture(scope="session")
def lanes(request):
    """The session's background jobs (tests/lanes.py): ``lanes.result(name)``."""
    return request.config.stash[LANES]
