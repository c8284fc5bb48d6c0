"""What a test runs on each rank, and how a rank tells the parent why it failed.

A rank is a fork of the pytest process made after collection, so it holds every collected
test item, its module with pytest's rewritten asserts, and pytest's own config: the body
runs as pytest would run it, and a failure is formatted by pytest's own ``repr_failure``
on the rank where it happened (the values are there, not in the parent). The rank then
re-raises: it exits at once, so peers blocked on it fail fast, and the parent's watch
takes over (see ``harness.launch.rank``).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import traceback
from typing import Any, Callable

HARNESS = os.sep + "harness" + os.sep  # distdoctor's own frames are left out of reports
EVENT = "distdoctor.test"  # the kind of the one record a failing rank emits
STALE = "distdoctor.stale"  # what a rank forked before the test was collected returns
_ITEMS: dict[str, Any] = {}  # nodeid -> pytest Item, filled in the parent before any fork


def remember(items) -> None:
    """Called in the parent after collection: every rank forked later can find them."""
    _ITEMS.update((item.nodeid, item) for item in items)


def run_item(ctx, nodeid: str, funcargs: dict[str, Any]) -> Any:
    """Run one collected test's body on this rank with the parent's fixture values and
    this rank's ``rank``; the captured output is the result."""
    item = _ITEMS.get(nodeid)
    if item is None:
        return STALE
    kwargs = {name: ctx.rank if name == "rank" else value for name, value in funcargs.items()}
    _torchrun_environment(ctx)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            _assertion_hooks(item):
        try:
            item.obj(**kwargs)
        except BaseException as exc:
            _tell(ctx, exc, out, err, lambda info: str(item.repr_failure(info)))
            raise
    return _output(out, err)


def call(ctx, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)`` on this rank for the ``ranks`` fixture: (value, output)."""
    _torchrun_environment(ctx)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            value = fn(*args, **kwargs)
        except BaseException as exc:
            _tell(ctx, exc, out, err, _plain_repr)
            raise
    return value, _output(out, err)


def _output(out: io.StringIO, err: io.StringIO) -> dict:
    """What the job printed, and whether the default group is still up (a test may destroy
    it; the pool is then re-formed before the next test)."""
    import torch.distributed as dist

    return {"stdout": out.getvalue(), "stderr": err.getvalue(), "group": dist.is_initialized()}


def _torchrun_environment(ctx) -> None:
    """The variables torchrun gives its workers, for code that reads them."""
    os.environ.update(RANK=str(ctx.rank), LOCAL_RANK=str(ctx.rank),
                      WORLD_SIZE=str(ctx.world_size), LOCAL_WORLD_SIZE=str(ctx.world_size),
                      GROUP_RANK="0")


def _tell(ctx, exc: BaseException, out: io.StringIO, err: io.StringIO,
          formatted: Callable[[Any], str]) -> None:
    """Send the parent this rank's account of its failure (never raising itself)."""
    from _pytest._code import ExceptionInfo
    from _pytest.outcomes import Skipped, XFailed

    from harness.doctor.report import raising_line

    info = ExceptionInfo.from_exception(exc)
    outcome = "skipped" if isinstance(exc, Skipped) else \
        "xfailed" if isinstance(exc, XFailed) else "failed"
    try:
        text = formatted(info) if outcome == "failed" else str(getattr(exc, "msg", exc))
    except Exception:  # pytest's formatting failed: the plain traceback still says it
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    where = raising_line("".join(traceback.format_tb(exc.__traceback__)))
    headline = (info.exconly().strip() or type(exc).__name__).splitlines()[0][:300]
    try:
        ctx.emit((EVENT, {"outcome": outcome, "text": text, "where": where,
                          "headline": headline, "stdout": out.getvalue(),
                          "stderr": err.getvalue()}))
    except Exception:
        pass  # the parent still gets the traceback from the raise


def _plain_repr(info) -> str:
    """pytest's long form without distdoctor's own frames, and installed packages' frames
    (torch's) one line each."""
    from _pytest._code import Traceback

    def user_part(excinfo) -> Traceback:
        kept = [entry for entry in excinfo.traceback.filter(excinfo)
                if HARNESS not in str(entry.frame.code.path)]
        return Traceback(entry.with_repr_style("short")
                         if "site-packages" in str(entry.frame.code.path) else entry
                         for entry in kept)

    return str(info.getrepr(style="long", tbfilter=user_part, truncate_locals=True))


@contextlib.contextmanager
def _assertion_hooks(item):
    """pytest's own set-up of assertion comparisons for ``item`` (the detailed diff of
    ``assert a == b``), as its runtest protocol makes it, around the body."""
    hooks = None
    try:
        from _pytest import assertion

        hooks = assertion.pytest_runtest_protocol(item)
        next(hooks)
    except Exception:
        hooks = None  # plain rewritten asserts still show their values
    try:
        yield
    finally:
        if hooks is not None:
            with contextlib.suppress(BaseException):
                hooks.send(None)


def echo(outputs: dict[int, dict], stream=None) -> None:
    """Each rank's captured output, line by line behind its rank (as torchrun's --tee)."""
    stream = stream or sys.stdout
    for rank in sorted(outputs):
        for key in ("stdout", "stderr"):
            text = outputs[rank].get(key) or ""
            for line in text.splitlines():
                print(f"[rank{rank}]:{line}", file=stream if key == "stdout" else sys.stderr)
