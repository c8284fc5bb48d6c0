"""Detectors: one module per failure mode, each ``check(record) -> list[Finding]``.

A detector reads the evidence in a RunRecord and nothing else: never which fault was
injected, so it works the same on a user's own run.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from harness.models import Finding, RunRecord


def detectors() -> list[ModuleType]:
    """Every module in this package that defines ``check``, in name order."""
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if callable(getattr(module, "check", None)):
            found.append(module)
    return found


def run_all(record: RunRecord) -> tuple[Finding, ...]:
    return tuple(finding for module in detectors() for finding in module.check(record))
