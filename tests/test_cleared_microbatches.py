"""A zero_grad() between the micro-batches of a step, read from a trace: the forwards
between two optimiser steps are its micro-batches, a backward span after each says it ran,
and a clear after one of them and before the next threw it away. Real ranks: the
example zero_grad_per_microbatch.py (test_run_examples) and the healthy corpus's
batch_passed_over.py (one step retried: a clear in one step of many)."""

from __future__ import annotations

import pytest
from traces import forward, record

from distdoctor.checks import cleared_microbatches
from distdoctor.models.events import Ev

pytestmark = pytest.mark.tier("unit")


def backward(steps: int, t: float) -> dict:
    return {"ev": Ev.PHASE, "k": "backward", "t0": t, "t1": t + 0.1, "s": steps, "where": ""}


def cleared(steps: int, t: float) -> dict:
    return {"ev": Ev.GRADS_CLEARED, "steps": steps, "t": t, "where": "train.py:7"}


def step(steps: int, start: float, micro: int, clear: bool) -> list[dict]:
    """One optimiser step's micro-batches, each forward then backward, a clear before
    every micro-batch after the first when ``clear``."""
    events: list[dict] = []
    for m in range(micro):
        t = start + m
        if clear and m:
            events.append(cleared(steps, t - 0.5))
        events += [forward(steps, t), backward(steps, t + 0.2)]
    return events


def trace(clears: list[bool], micro: int = 4) -> list[dict]:
    return [e for s, clear in enumerate(clears) for e in step(s, 10.0 * s, micro, clear)] + \
        [forward(len(clears), 10.0 * len(clears))]  # the next step's first forward


def test_a_clear_between_the_micro_batches_of_every_step_is_named():
    found = cleared_microbatches.check(record(trace([True] * 4), trace([True] * 4)))
    assert [(f.kind, f.ranks) for f in found] == [("cleared-microbatches", (0, 1))]
    assert {k: found[0].measured[k] for k in ("micro_batches", "applied_micro_batches",
                                              "first_step")} == {
        "micro_batches": 4, "applied_micro_batches": 1, "first_step": 1}
    assert found[0].measured["steps"] == {"0": [1, 2, 3, 4], "1": [1, 2, 3, 4]}
    assert found[0].where == ("train.py:7",)


def test_a_batch_passed_over_now_and_then_and_clears_outside_a_step_are_quiet():
    assert cleared_microbatches.check(record(trace([True, False, False, False]))) == []
    # the usual loop: zero_grad() right after the step (or before the step's first
    # forward), whatever the micro-batches
    usual = [e for s in range(4) for e in [cleared(s, 10.0 * s - 0.5), *step(
        s, 10.0 * s, 4, False)]]
    assert cleared_microbatches.check(record(usual + [forward(4, 40.0)])) == []
    # a clear after a forward whose backward never ran (an evaluation through the
    # wrapper) threw nothing away
    no_backward = [e for e in trace([True] * 4) if e["ev"] != Ev.PHASE]
    assert cleared_microbatches.check(record(no_backward)) == []


def test_steps_a_grad_scaler_skipped_are_not_judged():
    skips = [{"ev": Ev.STEP_SKIPPED, "steps": s, "t": 10.0 * s + 5} for s in range(4)]
    assert cleared_microbatches.check(record(trace([True] * 4) + skips)) == []


def test_a_clear_just_before_the_step_applies_none_of_the_micro_batches():
    """zero_grad() moved out of the micro-batch loop to just before optimizer.step(): a
    fix students make, which throws every micro-batch away."""
    late = [e for s in range(4) for e in [*step(s, 10.0 * s, 4, False),
                                          cleared(s, 10.0 * s + 4)]] + [forward(4, 40.0)]
    found = cleared_microbatches.check(record(late))
    assert found[0].measured["applied_micro_batches"] == 0
    assert "applied none of them" in found[0].symptom


def test_a_step_whose_weights_moved_between_its_forwards_is_no_accumulation():
    """Sharpness-aware minimisation: forward, backward, clear, perturb the weights, forward
    again (healthy/sharpness_aware.py on real ranks). Each forward says the weights' count
    of in-place changes; the same trace at one count is accumulation thrown away."""
    def at(version_of):
        return [e | ({"version": version_of(e)} if e["ev"] == Ev.DDP_FORWARD else {})
                for e in trace([True] * 4, micro=2)]

    assert cleared_microbatches.check(record(at(lambda e: int(e["t"] * 10)))) == []
    assert cleared_microbatches.check(record(at(lambda e: e["steps"])))[0].measured[
        "micro_batches"] == 2


def test_one_forward_whose_losses_are_backwarded_one_at_a_time_is_no_accumulation():
    """Gradient surgery (PCGrad): one forward, then each task's loss backwarded alone
    between clears, its gradient kept by hand and combined before the step."""
    surgery = [e for s in range(4) for e in [
        forward(s, 10.0 * s), backward(s, 10.0 * s + 1), cleared(s, 10.0 * s + 2),
        backward(s, 10.0 * s + 3)]] + [forward(4, 40.0)]
    assert cleared_microbatches.check(record(surgery)) == []
