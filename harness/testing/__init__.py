"""Testing users' own distributed code.

``plugin`` is the pytest plugin (``world_size`` marker, ``rank``/``world_size``/``ranks``
fixtures); ``onrank`` is what runs on each rank; ``ranks`` drives warm ranks from the
parent; ``verdict`` turns a job's end into a test's verdict; ``same`` and ``oneprocess``
are the assertion helpers.
"""

from harness.testing.oneprocess import assert_trains_like_one_process
from harness.testing.same import assert_same_on_all_ranks
from harness.testing.verdict import RankFailure

__all__ = ["RankFailure", "assert_same_on_all_ranks", "assert_trains_like_one_process"]
