"""The memory budget a job's ranks measure their training state against
(trace/memory.py), set for the ranks started meanwhile: ``distdoctor run --memory-budget``
and an exercise graded under a budget both start their ranks inside it."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

from distdoctor.trace.memory import BUDGET_ENV


@contextlib.contextmanager
def memory_budget(budget: int | None) -> Iterator[None]:
    """Ranks started inside measure against ``budget`` bytes (None or 0: as before); the
    environment is put back as it was after."""
    if not budget:
        yield
        return
    kept = os.environ.get(BUDGET_ENV)
    os.environ[BUDGET_ENV] = str(budget)
    try:
        yield
    finally:
        if kept is None:
            os.environ.pop(BUDGET_ENV, None)
        else:
            os.environ[BUDGET_ENV] = kept
