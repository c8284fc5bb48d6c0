"""How a run's rank endings read in one line: the root cause first, ranks in order; and
how a list or a line too long to print whole is cut (one way, everywhere)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from distdoctor.models import Evidence, RankEnd, RankRecord, RunRecord, RunSpec
from distdoctor.models.calls import clipped, first_few
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


@given(items=st.lists(st.text(alphabet="abc", min_size=1, max_size=3), max_size=12),
       shown=st.integers(1, 10))
def test_a_long_list_names_its_first_few_and_counts_the_rest(items, shown):
    said = first_few(items, shown)
    named, _, rest = said.partition(" and ")
    assert named.split(", ") == (items[:shown] or [""])
    assert rest == (f"{len(items) - shown} more" if len(items) > shown else "")


@given(text=st.text(max_size=300), most=st.integers(3, 250))
def test_a_clipped_line_is_the_text_or_its_start_and_dots_within_the_limit(text, most):
    short = clipped(text, most)
    assert short == text if len(text) <= most else (
        len(short) == most and short == text[:most - 3] + "...")
