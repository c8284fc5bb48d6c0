"""Testing users' own distributed code: the pytest plugin (``plugin``), what runs on each
rank (``onrank``), how a job's end becomes a test's verdict (``verdict``), and assertion
helpers to call inside the ranks."""

from harness.testing.verdict import RankFailure

__all__ = ["RankFailure"]
