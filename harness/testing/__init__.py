"""Testing users' own distributed code.

``plugin`` is the pytest plugin (``world_size`` marker, ``rank``/``world_size``/``ranks``
fixtures); ``onrank`` is what runs on each rank; ``ranks`` drives warm ranks from the
parent; ``verdict`` turns a job's end into a test's verdict; ``same`` and ``oneprocess``
are the assertion helpers.
"""

from importlib import import_module

# name -> its module; imported on first use, so that loading the plugin (at every pytest
# start in an environment that has distdoctor) does not import torch
_PUBLIC = {"RankFailure": "verdict", "StragglerWarning": "verdict",
           "assert_same_on_all_ranks": "same",
           "assert_trains_like_one_process": "oneprocess",
           "assert_resumes_like_uninterrupted": "resumes"}
__all__ = list(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_PUBLIC[name]}"), name)
