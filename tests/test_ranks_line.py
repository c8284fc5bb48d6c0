"""How a run's rank endings read in one line: the root cause first, ranks in order."""

from __future__ import annotations

import pytest

from distdoctor.models import Evidence, RankEnd, RankRecord, RunRecord, RunSpec
from distdoctor.text import ranks_line

pytestmark = pytest.mark.tier("unit")

OOM = "Traceback (most recent call last):\ntorch.OutOfMemoryError: out of memory"
RESET = "Traceback (most recent call last):\nRuntimeError: Connection reset by peer"


def record(*ends: RankEnd) -> RunRecord:
    return RunRecord(RunSpec(world_size=len(ends)),
                     tuple(RankRecord(e.rank, e, Evidence(e.rank)) for e in ends), wall_s=1.0)


def test_ranks_that_ended_alike_are_listed_in_rank_order_root_cause_first():
    line = ranks_line(record(RankEnd(0, "raised", at=0.3, error=OOM),
                             RankEnd(1, "raised", at=0.5, error=RESET),
                             RankEnd(2, "raised", at=0.2, error=OOM),
                             RankEnd(3, "raised", at=0.1, error=OOM)))
    assert line == ("ranks 0, 2, 3 raised: torch.OutOfMemoryError: out of memory; "
                    "rank 1 raised (echo: a peer went away)")


def test_a_clean_run_reads_as_all_finished():
    assert ranks_line(record(RankEnd(0, "finished"), RankEnd(1, "finished"))) == \
        "all 2 ranks finished"
