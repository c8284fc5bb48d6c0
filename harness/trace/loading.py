"""A rank still loading code is moving, not hung.

A rank's progress is the calls it makes, yet between two calls it may load code for
longer than a short deadline: DDP's first construction imports about 800 modules, which
takes seconds on a loaded machine. It is moving all that time, and what moves is its
count of loaded modules. So every watch (the parent's over ``run SCRIPT``'s ranks and the
warm pool, a rank's own under torchrun) counts a change of that count as progress, as it
counts a call. A rank spinning in its own code, or blocked, loads nothing: it is judged
as before. Reading the count is one ``len`` of ``sys.modules``: the program sees nothing.
"""

from __future__ import annotations

import sys


def modules_loaded() -> int:
    """How many modules this process has loaded (it grows while it imports)."""
    return len(sys.modules)


class LoadWatch:
    """When this process's module count last changed, as seen by polling it."""

    def __init__(self, now: float) -> None:
        self.count = modules_loaded()
        self.changed = now

    def note(self, now: float) -> float:
        """Look again; when the count last changed (``now`` if it just did)."""
        count = modules_loaded()
        if count != self.count:
            self.count, self.changed = count, now
        return self.changed
