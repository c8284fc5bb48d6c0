"""Shared fixtures: warm rank pools, so no test pays for a process group of its own."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def pools():
    """``pools(n)``: the session's warm n-rank gloo pool (re-formed if a job broke it)."""
    from harness.pool import shared_pool

    return shared_pool
