"""The pytest plugin: a test marked ``world_size(n)`` runs on n real gloo ranks of a warm
pool, and a broken run fails with the rank, the cause and the user's line, never a hang.

Registered as the ``distdoctor`` pytest11 entry point (``-p no:distdoctor`` turns it off).

The deadline of a test, the longest its body may run on the ranks, comes from one place,
in this order: the marker's ``deadline=``, ``--distdoctor-deadline``, the ini key
``distdoctor_deadline``, 300 s. A proven deadlock stops in well under a second whatever
the deadline; the deadline is for what cannot be proven (a rank spinning, a peer still
computing), so it is generous. When pytest-timeout would end the test first, the deadline
is cut to end 3 s before it, so the diagnosis, not pytest-timeout's stack dump, is what
the user reads. pytest-timeout's timeout for a test is learnt from its public hook,
``pytest_timeout_set_timer``, as it starts the timer; this plugin's own state lives in
``config.stash`` and ``item.stash``, as pytest-timeout and pytest-xdist keep theirs.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import replace
from typing import Any

import pytest

from distdoctor.models import deadlines
from distdoctor.testing.ranks import RanksFactory, cut, judge_job, picklable, positive, run_on

DEFAULT_DEADLINE = deadlines.USER_JOB_S
TIMEOUT_MARGIN = 3.0  # seconds left to pytest-timeout after our deadline
_ARGS = ("rank", "world_size")  # per-rank fixtures: not sent from the parent
# per test: pytest-timeout's timeout and when its timer started (from its hook)
_TIMER = pytest.StashKey[tuple[float, float]]()
_RUNNING = pytest.StashKey[list[pytest.Item]]()  # per session: the test being run, if any


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("distdoctor", "distributed tests on warm ranks (distdoctor)")
    group.addoption("--distdoctor-deadline", type=float, metavar="SECONDS", default=None,
                    help="longest a world_size test may run on its ranks (default: the "
                         f"ini key distdoctor_deadline, else {DEFAULT_DEADLINE:.0f})")
    parser.addini("distdoctor_deadline", help="longest a world_size test may run on its "
                  f"ranks, in seconds (default {DEFAULT_DEADLINE:.0f})", default=None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "world_size(n, deadline=None): run the test on n real gloo ranks (a list "
        "of sizes: one test per size), with the default process group initialised")
    _session_deadline(config)  # a bad value is an error at once, not at the first test
    config.stash[_RUNNING] = []
    from distdoctor.testing import ranks

    ranks.time_left_from(lambda: _time_to_timeout(config))


def _positive(value: Any, where: str) -> float:
    try:
        return positive(value, where)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def _session_deadline(config: pytest.Config) -> float:
    option = config.getoption("distdoctor_deadline", None)
    if option is not None:
        return _positive(option, "--distdoctor-deadline")
    ini = config.getini("distdoctor_deadline")
    if ini not in (None, ""):
        return _positive(ini, "ini key distdoctor_deadline")
    return DEFAULT_DEADLINE


def _marker_error(marker: pytest.Mark) -> str | None:
    """What is wrong with a world_size marker, if anything."""
    if len(marker.args) != 1 or set(marker.kwargs) - {"deadline"}:
        return "use @pytest.mark.world_size(n) or world_size([n, ...]), optionally with " \
               "deadline=SECONDS"
    sizes = marker.args[0]
    sizes = list(sizes) if isinstance(sizes, (list, tuple)) else [sizes]
    if not sizes or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1
                            for n in sizes):
        return f"world_size takes a positive whole number of ranks or a non-empty list " \
               f"of them, got {marker.args[0]!r}"
    if "deadline" in marker.kwargs:
        try:
            positive(marker.kwargs["deadline"], "deadline=")
        except ValueError as exc:
            return str(exc)
    return None


def _sizes(marker: pytest.Mark) -> list[int]:
    sizes = marker.args[0]
    return list(sizes) if isinstance(sizes, (list, tuple)) else [sizes]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("world_size")
    if marker is None or _marker_error(marker):
        return  # a bad marker fails its own test at set-up (pytest_runtest_setup)
    sizes = _sizes(marker)
    if len(sizes) > 1 or isinstance(marker.args[0], (list, tuple)):
        if "world_size" not in metafunc.fixturenames:
            metafunc.fixturenames.append("world_size")
        metafunc.parametrize("world_size", sizes, indirect=True,
                             ids=[f"world_size={n}" for n in sizes])


def pytest_collection_finish(session: pytest.Session) -> None:
    from distdoctor.testing.onrank import remember

    remember(session.items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> None:
    item.config.stash[_RUNNING][:] = [item]


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> None:
    """pytest-timeout starts a test's timer: note its timeout and start, and let it go on
    (returning None leaves the timer to pytest-timeout itself)."""
    timeout = getattr(settings, "timeout", None)
    if timeout and timeout > 0:
        item.stash[_TIMER] = (float(timeout), time.monotonic())
    return None


def _time_to_timeout(config: pytest.Config) -> float | None:
    """Seconds left before pytest-timeout ends the running test, less TIMEOUT_MARGIN."""
    running = config.stash.get(_RUNNING, [])
    if not running or _TIMER not in running[0].stash:
        return None
    timeout, started = running[0].stash[_TIMER]
    return max(1.0, timeout - (time.monotonic() - started) - TIMEOUT_MARGIN)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker("world_size")
    error = marker and _marker_error(marker)
    if error:
        pytest.fail(f"@pytest.mark.world_size: {error}", pytrace=False)


@pytest.fixture
def world_size(request: pytest.FixtureRequest) -> int:
    """The number of ranks this test runs on (from its world_size marker)."""
    if hasattr(request, "param"):
        return request.param
    marker = request.node.get_closest_marker("world_size")
    if marker is None:
        pytest.fail("the world_size fixture needs @pytest.mark.world_size(n) on the test",
                    pytrace=False)
    return _sizes(marker)[0]


@pytest.fixture
def rank(request: pytest.FixtureRequest) -> None:
    """This rank's number; it exists only on the ranks (None in the parent)."""
    if request.node.get_closest_marker("world_size") is None:
        pytest.fail("the rank fixture needs @pytest.mark.world_size(n) on the test",
                    pytrace=False)
    askers = sorted(name for name, defs in request.node._fixtureinfo.name2fixturedefs.items()
                    for fixture in defs if "rank" in fixture.argnames)
    if askers:
        pytest.fail(f"fixture {askers[0]!r} asks for `rank`, but fixtures are built once, in "
                    "the parent, and sent to every rank; ask for `rank` in the test itself "
                    "(or read torch.distributed.get_rank() there)", pytrace=False)
    return None


@pytest.fixture(scope="session")
def ranks(pytestconfig: pytest.Config) -> RanksFactory:
    """``ranks(n, deadline=None).run(fn, *args, **kwargs)``: run a module-level ``fn`` on n
    warm ranks and get their results (session-scoped, so it works in hypothesis tests)."""
    return RanksFactory(_session_deadline(pytestconfig))


def _parametrized_size(item: pytest.Function) -> int | None:
    """The size this instance of a ``world_size([...])`` test runs at. From its call spec:
    the fixture's value reaches ``funcargs`` only when the test itself asks for
    ``world_size``, and without it every size ran at the first (world_size([4, 8]) ran
    twice on 4 ranks)."""
    callspec = getattr(item, "callspec", None)
    size = callspec.params.get("world_size") if callspec is not None else None
    if not isinstance(size, int):
        size = item.funcargs.get("world_size")
    return size if isinstance(size, int) else None


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    marker = pyfuncitem.get_closest_marker("world_size")
    if marker is None:
        return None
    from distdoctor.testing import onrank

    n = _parametrized_size(pyfuncitem) or _sizes(marker)[0]
    deadline = _item_deadline(pyfuncitem, marker)
    names = pyfuncitem._fixtureinfo.argnames
    funcargs = {name: None if name == "rank" else pyfuncitem.funcargs[name] for name in names}
    for name, value in funcargs.items():
        if name not in _ARGS:
            if not picklable(value):
                pytest.fail(f"fixture {name!r} ({type(value).__name__}) cannot be sent to "
                            "the ranks: fixtures are built once, in the parent, and only "
                            "values pickle can copy reach the ranks; build it inside the "
                            "test instead", pytrace=False)
    result = run_on(n, deadline, onrank.run_item, pyfuncitem.nodeid, funcargs)
    if any(value == onrank.STALE for value in result.values):
        from distdoctor.launch.pool import shared_pool

        shared_pool(n).reset()  # forked before this test was collected: fork anew
        result = run_on(n, deadline, onrank.run_item, pyfuncitem.nodeid, funcargs)
    outcome = judge_job(result, deadline, pyfuncitem.nodeid)
    timeout = _pytest_timeout(pyfuncitem)
    if outcome.status == "failed" and timeout and deadline < _asked_deadline(pyfuncitem, marker):
        outcome = replace(outcome, text=f"{outcome.text}\n(the deadline was cut to "
                          f"{deadline:.1f} s, so that this report comes before pytest-timeout "
                          f"ends the test at {timeout:g} s)")
    if outcome.status == "passed":  # passed, but slowed by one rank: said, not failed
        from distdoctor.testing.verdict import StragglerWarning, stragglers

        for text in stragglers(result, deadline, pyfuncitem.nodeid):
            pyfuncitem.user_properties.append(("distdoctor straggler", text))
            warnings.warn(StragglerWarning(text), stacklevel=1)
    if outcome.status == "skipped":  # reported at the test's line, as a skip marker is
        raise pytest.skip.Exception(outcome.text, _use_item_location=True)
    if outcome.status == "xfailed":
        pytest.xfail(outcome.text)
    if outcome.status == "failed":
        pytest.fail(outcome.text, pytrace=False)
    return True


def _asked_deadline(item: pytest.Item, marker: pytest.Mark) -> float:
    """The deadline by the marker, the command line, the ini file or the default."""
    return _positive(marker.kwargs["deadline"], "deadline=") \
        if "deadline" in marker.kwargs else _session_deadline(item.config)


def _item_deadline(item: pytest.Item, marker: pytest.Mark) -> float:
    """The asked deadline, cut to end TIMEOUT_MARGIN before pytest-timeout would."""
    return cut(_asked_deadline(item, marker))


def _pytest_timeout(item: pytest.Item) -> float | None:
    """pytest-timeout's timeout for this item, as its hook told us (None without it)."""
    return item.stash[_TIMER][0] if _TIMER in item.stash else None


def pytest_unconfigure(config: pytest.Config) -> None:
    from distdoctor.testing import ranks

    ranks.time_left_from(None)
    config.stash.get(_RUNNING, []).clear()
