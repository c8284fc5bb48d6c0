"""What a test runs on each rank, and how a rank tells the parent why it failed.

A rank is a fork of the pytest process made after collection, so it holds every collected
test item, its module with pytest's rewritten asserts, and pytest's own config: the body
runs as pytest would run it, and a failure is formatted by pytest's own ``repr_failure``
on the rank where it happened (the values are there, not in the parent). The rank then
re-raises: it exits at once, so peers blocked on it fail fast, and the parent's watch
takes over (see ``distdoctor.launch.rank``).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import traceback
from typing import Any, Callable

from distdoctor.models.events import Emit

# distdoctor's own frames are left out of reports
HARNESS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
EVENT = Emit.OUTCOME  # the kind of the one record a failing rank emits
OUTPUT = Emit.OUTPUT  # the kind of the records that carry what a rank printed
STALE = "distdoctor.stale"  # what a rank forked before the test was collected returns
_ITEMS: dict[str, Any] = {}  # nodeid -> pytest Item, filled in the parent before any fork


def remember(items) -> None:
    """Called in the parent after collection: every rank forked later can find them."""
    _ITEMS.update((item.nodeid, item) for item in items)


def run_item(ctx, nodeid: str, funcargs: dict[str, Any]) -> Any:
    """Run one collected test's body on this rank with the parent's fixture values and
    this rank's ``rank``; whether the default group is still up is the result."""
    item = _ITEMS.get(nodeid)
    if item is None:
        return STALE
    kwargs = {name: ctx.rank if name == "rank" else value for name, value in funcargs.items()}
    _torchrun_environment(ctx)
    with _printed_lines_go_home(ctx), _assertion_hooks(item):
        try:
            item.obj(**kwargs)
        except BaseException as exc:
            _tell(ctx, exc, lambda info: str(item.repr_failure(info)))
            raise
    return _group_state()


def call(ctx, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)`` on this rank for the ``ranks`` fixture: (value, group state)."""
    _torchrun_environment(ctx)
    with _printed_lines_go_home(ctx):
        try:
            value = fn(*args, **kwargs)
        except BaseException as exc:
            _tell(ctx, exc, _plain_repr)
            raise
    return value, _group_state()


def _group_state() -> dict:
    """Whether the default group is still up: a test may destroy it, and the pool is then
    re-formed before the next test."""
    import torch.distributed as dist

    return {"group": dist.is_initialized()}


class _LinesHome(io.TextIOBase):
    """A text stream that sends each whole line home as it is written, so what a rank
    printed reaches the parent even when the rank is then stopped in a hang."""

    def __init__(self, ctx, stream: str):
        super().__init__()
        self.ctx, self.stream, self.pending = ctx, stream, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.pending += text
        if "\n" in self.pending:
            lines, self.pending = self.pending.rsplit("\n", 1)
            self._send(lines)
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self._send(self.pending)
            self.pending = ""

    def _send(self, lines: str) -> None:
        with contextlib.suppress(Exception):
            self.ctx.emit((OUTPUT, self.stream, lines))


@contextlib.contextmanager
def _printed_lines_go_home(ctx):
    out, err = _LinesHome(ctx, "stdout"), _LinesHome(ctx, "stderr")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield
    finally:
        out.flush()
        err.flush()


def _torchrun_environment(ctx) -> None:
    """The variables torchrun gives its workers, for code that reads them."""
    os.environ.update(RANK=str(ctx.rank), LOCAL_RANK=str(ctx.rank),
                      WORLD_SIZE=str(ctx.world_size), LOCAL_WORLD_SIZE=str(ctx.world_size),
                      GROUP_RANK="0")


def _tell(ctx, exc: BaseException, formatted: Callable[[Any], str]) -> None:
    """Send the parent this rank's account of its failure (never raising itself)."""
    from _pytest._code import ExceptionInfo
    from _pytest.outcomes import Skipped, XFailed

    from distdoctor.userjob.reporting.report import raising_line

    info = ExceptionInfo.from_exception(exc)
    outcome = "skipped" if isinstance(exc, Skipped) else \
        "xfailed" if isinstance(exc, XFailed) else "failed"
    try:
        text = formatted(info) if outcome == "failed" else str(getattr(exc, "msg", exc))
    # Falls back to the plain traceback, which still says it; pytest's formatting failed: the plain
    # traceback still says it.
    except Exception:  # noqa: BLE001
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    where = raising_line("".join(traceback.format_tb(exc.__traceback__)))
    headline = (info.exconly().strip() or type(exc).__name__).splitlines()[0][:300]
    try:
        ctx.emit((EVENT, {"outcome": outcome, "text": text, "where": where,
                          "headline": headline}))
    except Exception:  # noqa: BLE001, S110 (the parent still gets the traceback from the raise)
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
    except Exception:  # noqa: BLE001 (falls back to Python's own assert message)
        hooks = None  # plain rewritten asserts still show their values
    try:
        yield
    finally:
        if hooks is not None:
            with contextlib.suppress(BaseException):
                hooks.send(None)


def echo(events: tuple[tuple, ...], stream=None) -> None:
    """What each rank printed, line by line behind its rank (as torchrun's --tee does):
    stdout to ``stream`` (default: ours), stderr to our stderr."""
    for rank, records in enumerate(events):
        for record in records:
            if isinstance(record, tuple) and len(record) == 3 and record[0] == OUTPUT:
                target = (stream or sys.stdout) if record[1] == "stdout" else sys.stderr
                for line in record[2].split("\n"):
                    print(f"[rank{rank}]:{line}", file=target)
