"""Run a recorder's set-up once a torch package is imported, by whoever imports it.

Importing torch's tensor-parallel or pipelining package costs up to half a second, so a
recorder of what they do waits for the user's script to import them: a script that never
does never pays.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Callable

from distdoctor.trace.tracer import incomplete


def after_import(name: str, then: Callable, what: str) -> None:
    """``then(module)`` once module ``name`` is imported (now, if it already is); a failure
    of ``then`` is reported as ``what`` cut short, never raised into the import."""
    if name in sys.modules:
        _run(then, sys.modules[name], what)
    else:
        sys.meta_path.insert(0, _AfterImport(name, then, what))


def _run(then: Callable, module, what: str) -> None:
    try:
        then(module)
    except Exception as exc:  # noqa: BLE001 (reported as incomplete evidence)
        incomplete(what, exc)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then(module)`` once ``name`` has been imported."""

    def __init__(self, name: str, then: Callable, what: str) -> None:
        self.name, self.then, self.what = name, then, what

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run, then, what = spec.loader.exec_module, self.then, self.what

        def exec_module(module):
            run(module)
            _run(then, module, what)

        setattr(spec.loader, "exec_module", exec_module)  # noqa: B010 (a patch)
        return spec
