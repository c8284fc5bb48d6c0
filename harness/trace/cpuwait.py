"""How long this process's threads have run on a CPU, and waited for one (the kernel's
run-queue delay).

A rank that arrives late at every collective may be slow in its own code, or runnable and
not running: its cores are taken by other work on the node (another job, a CPU hog, more
ranks than cores). The kernel counts the second for each thread
(``/proc/<pid>/task/<tid>/schedstat``: time on a CPU, time waiting for one, slices), so
the straggler check can tell the machine (a rank that waited for its CPU, with no more
work than the others) from the program (a rank that ran longer). Reading it changes
nothing.

Over a whole job these seconds are mostly start-up's (importing torch, forming the
group), which differs between ranks by more than a short run's steps add up to, so each
optimiser step's end also reads the main thread's own clock (``thread_cpu_seconds``,
about 11 microseconds): the straggler check compares ranks over exactly the steps it
judges, on the thread that arrives at the collectives.
"""

from __future__ import annotations

import glob

NS = 1e9


def cpu_seconds() -> tuple[float, float] | None:
    """(ran, waited): seconds this process's threads have run on a CPU and waited for one,
    since each started; None where the kernel does not say (another OS, or no schedstat)."""
    ran, waited, read = 0, 0, False
    for path in glob.glob("/proc/self/task/*/schedstat"):
        try:
            with open(path) as stat:
                fields = stat.read().split()
            ran, waited, read = ran + int(fields[0]), waited + int(fields[1]), True
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended as it was read
    return (ran / NS, waited / NS) if read else None


def thread_cpu_seconds() -> tuple[float, float] | None:
    """(ran, waited): seconds the calling thread has run on a CPU and waited for one, since
    it started; None where the kernel does not say."""
    try:
        with open("/proc/thread-self/schedstat") as stat:
            fields = stat.read().split()
        return int(fields[0]) / NS, int(fields[1]) / NS
    except (OSError, ValueError, IndexError):
        return None  # another OS, or a kernel built without schedstats: no machine verdict
