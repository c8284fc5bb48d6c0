"""A trace's last stall, read one way: from parsed events (analyze) and from the file's
bytes (the node's watching rank, the tests' torchrun helper) they must agree."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from distdoctor.models.events import Ev
from distdoctor.trace.stalls import still_stalled, still_stalled_in, stopped_raising

pytestmark = pytest.mark.tier("unit")

EVENTS = st.lists(st.fixed_dictionaries({
    "ev": st.sampled_from([Ev.ENTER, Ev.DONE, Ev.ERROR, Ev.STALLED, Ev.WAIT, Ev.PHASE]),
    "t": st.floats(0, 100, allow_nan=False)}), max_size=12)


def as_file(events: list[dict]) -> bytes:
    """As the tracer writes them: one compact JSON object a line."""
    return b"".join(json.dumps(e, separators=(",", ":")).encode() + b"\n" for e in events)


@given(events=EVENTS)
def test_the_bytes_and_the_events_agree_on_a_stall_moved_past(events):
    assert still_stalled_in(as_file(events)) == still_stalled(events)


def test_a_call_after_a_stall_moves_the_rank_past_it():
    stall, call = {"ev": Ev.STALLED, "t": 1.0}, {"ev": Ev.ENTER, "t": 2.0}
    assert still_stalled([call, stall]) and not still_stalled([stall, call])
    assert not still_stalled([call, {"ev": Ev.DONE, "t": 1.5}])


def test_a_call_that_failed_then_a_stall_decided_before_the_failure_was_raising():
    """The watch decides, samples 60 ms, writes: the failure lands first in the file."""
    failed = {"ev": Ev.ERROR, "t": 2.06, "error": "Connection closed by peer"}
    call = {"ev": Ev.ENTER, "t": 0.0}
    assert stopped_raising([call, failed, {"ev": Ev.STALLED, "t": 2.0}]) == \
        "Connection closed by peer"
    assert stopped_raising([call, failed]) == "Connection closed by peer"
    # stalled after the failure: it went on past it (caught it), so it was not raising
    assert stopped_raising([call, failed, {"ev": Ev.STALLED, "t": 3.0}]) is None
    assert stopped_raising([call, failed, {"ev": Ev.ENTER, "t": 2.5}]) is None
    assert stopped_raising([call, {"ev": Ev.STALLED, "t": 2.0}]) is None
