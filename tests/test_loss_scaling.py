"""Mixed precision's loss scaling read from a trace: the local gradients a GradScaler's
backward accumulated are of ``loss * scale``, and a step it skipped applied nothing.
Healthy AMP runs were told ``sum-without-mean`` (0.00x the mean) and
``allreduce-every-microbatch`` (the overflowed step's forward counted as a micro-batch
of the next); real ranks are in the transparency corpus (amp_grad_scaler.py)."""

from __future__ import annotations

import struct

import pytest
from traces import forward, record

from distdoctor.checks import allreduce_every_microbatch, sum_without_mean
from distdoctor.models.events import Ev

pytestmark = pytest.mark.tier("unit")


def rows(*values: list[float]) -> str:
    """Sample rows as the tracer writes them: little-endian float64, in hex."""
    flat = [v for row in values for v in row]
    return struct.pack(f"<{len(flat)}d", *flat).hex()


def grads(local: list[float], applied: list[float], scale: float | None) -> dict:
    event = {"ev": Ev.GRADS, "step": 1, "rows": rows(local, applied, [0.0, 0.0]),
             "numel": 2, "where": "train.py:12", "t": 1.0}
    return event | ({"scale": scale} if scale is not None else {})


def test_local_gradients_of_a_scaled_loss_are_read_in_the_losss_units():
    # scale 1024: local (1024, 3072) and (3072, 1024) are (1, 3) and (3, 1) of the loss;
    # both ranks applied the mean (2, 2): averaged, ratio 1
    averaged = record([grads([1024.0, 3072.0], [2.0, 2.0], 1024.0)],
                      [grads([3072.0, 1024.0], [2.0, 2.0], 1024.0)])
    assert averaged.ranks[0].evidence.gradients[0].local.values == (1.0, 3.0)
    assert sum_without_mean.check(averaged) == []
    # summed by hand after the scaler: (4, 4) is twice the mean, at any scale
    summed = record([grads([1024.0, 3072.0], [4.0, 4.0], 1024.0)],
                    [grads([3072.0, 1024.0], [4.0, 4.0], 1024.0)])
    assert sum_without_mean.check(summed)[0].measured["ratio"] == pytest.approx(2.0)
    # a scale that is no positive number (a trace from elsewhere) is not applied
    odd = record([grads([1.0, 3.0], [2.0, 2.0], -1.0)], [grads([3.0, 1.0], [2.0, 2.0], "x")])
    assert odd.ranks[1].evidence.gradients[0].local.values == (3.0, 1.0)


def test_a_step_the_scaler_skipped_lends_no_micro_batch_to_the_next():
    # step 1 overflowed and was skipped (t=1.5); its retry at t=2 stepped; then step 2
    skipped = [forward(0, 1.0), {"ev": Ev.STEP_SKIPPED, "steps": 0, "t": 1.5},
               forward(0, 2.0), forward(1, 3.0)]
    assert allreduce_every_microbatch.check(record(skipped, skipped)) == []
    # the same forwards with no skip: two synchronised micro-batches in step 1
    both = [e for e in skipped if e["ev"] != Ev.STEP_SKIPPED]
    found = allreduce_every_microbatch.check(record(both, both))
    assert found[0].measured["syncs_per_step"] == 2
    # a skip after the step's forwards (a later step's) does not hide them
    later = both + [{"ev": Ev.STEP_SKIPPED, "steps": 1, "t": 3.5}]
    assert allreduce_every_microbatch.check(record(later, later))[0].measured[
        "micro_batches_per_step"] == 2


def test_one_step_retried_is_no_accumulation_but_the_loops_habit_is():
    """A loss passed over (``zero_grad(); continue``) leaves its synced forward in the
    next step's count: once in 4 steps is a retry; in most steps, micro-batches."""
    once = [forward(0, 1.0), forward(1, 2.0), forward(1, 3.0), forward(2, 4.0),
            forward(3, 5.0), forward(4, 6.0)]
    assert allreduce_every_microbatch.check(record(once, once)) == []
    every = [forward(s, 2.0 * s + half) for s in range(4) for half in (0.0, 1.0)] + \
        [forward(4, 9.0)]
    found = allreduce_every_microbatch.check(record(every, every))
    assert found[0].measured["steps_affected"] == 4
