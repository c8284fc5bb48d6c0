"""The resume comparison on traces written by hand: the first step and the first thing,
in the order a step depends on them, that differs after the resume; what differs
between two runs from the start is not compared; RNG states that nothing draws from are
not a failure."""

from __future__ import annotations

import pytest

from distdoctor.analysis.resume import checkpoint_step, compare
from distdoctor.models.events import Ev

pytestmark = pytest.mark.tier("unit")

SAME = {"params": "p", "grads": "g", "optimizer_state": "o", "settings": [{"lr": 0.1}],
        "rng_torch": "t", "rng_numpy": "n", "rng_python": "r"}


def run(steps: range, changes: dict[int, dict] | None = None, first: int = 1,
        saves: tuple[int, ...] = (), loads: bool = False) -> tuple[dict, ...]:
    """A rank's trace: a batch and a state per step (the step's own digests, made to
    differ by ``changes[step]``), numbered from ``first`` as the rank counts them."""
    trace: list[dict] = [{"ev": Ev.LOAD, "where": "/w/train.py:9"}] if loads else []
    for count, step in enumerate(steps, first):
        trace.append({"ev": Ev.BATCH, "steps": count - 1, "sampler_epoch": step // 4,
                      "ids": [step, step + 100]})
        state = {k: (f"{v}{step}" if isinstance(v, str) else v) for k, v in SAME.items()}
        trace.append({"ev": Ev.STATE, "step": count, **state, **(changes or {}).get(step, {})})
        if step in saves:
            trace.append({"ev": Ev.SAVE, "n": saves.index(step) + 1, "step": count,
                          "where": "/w/train.py:30"})
    return tuple(trace)


def test_a_resume_that_restores_everything_matches_and_says_what_it_compared():
    whole = [run(range(1, 9)), run(range(1, 9))]
    stopped = [run(range(1, 5), saves=(2, 4)), run(range(1, 5), saves=(2, 4))]
    assert checkpoint_step(stopped, 2) == 4 and checkpoint_step(stopped, 3) is None
    resumed = [run(range(5, 9), loads=True), run(range(5, 9), loads=True)]
    found = compare(whole, stopped, resumed, 4)
    assert found.ok and found.compared_steps == (5, 8), found.summary


def test_the_first_thing_a_step_depends_on_is_blamed_first():
    """Rank 1's momentum and gradients differ at step 6: the optimiser's state is named,
    not the gradients it follows from, with the lines that saved and loaded."""
    whole = [run(range(1, 9))] * 2
    stopped = [run(range(1, 5), saves=(4,))] * 2
    parted = {6: {"optimizer_state": "other", "grads": "other"}, 7: {"params": "other"}}
    resumed = [run(range(5, 9), loads=True), run(range(5, 9), parted, loads=True)]
    found = compare(whole, stopped, resumed, 4)
    assert (found.ok, found.kind, found.ranks) == (False, "optimizer-state-not-restored", (1,))
    assert found.summary.startswith("rank 1: the optimiser's state at step 6 after the "
                                    "resume differs from the uninterrupted run's")
    assert "saved by every rank at /w/train.py:30; loaded by every rank at /w/train.py:9" \
        in found.summary


def test_an_rng_state_is_blamed_with_the_gradients_and_harmless_without():
    whole = [run(range(1, 7))] * 2
    stopped = [run(range(1, 3), saves=(2,))] * 2
    drawn = {3: {"rng_torch": "rank0s", "grads": "other"}}
    found = compare(whole, stopped, [run(range(3, 7), loads=True),
                                     run(range(3, 7), drawn, loads=True)], 2)
    assert (found.kind, found.ranks, found.measured["which"]) == \
        ("rng-state-not-restored", (1,), ["torch"])
    unused = {3: {"rng_torch": "rank0s"}}
    found = compare(whole, stopped, [run(range(3, 7), loads=True),
                                     run(range(3, 7), unused, loads=True)], 2)
    assert found.ok and "rank 1' RNG state differs from step 3, harmless" in found.summary


def test_other_samples_at_the_same_step_are_the_loaders_position():
    whole = [run(range(1, 7))] * 2
    stopped = [run(range(1, 3), saves=(2,))] * 2
    replayed = [run(range(1, 5), first=1, loads=True)] * 2  # reads steps 1.. again
    found = compare(whole, stopped, replayed, 2)
    # its parameters are step 1's
    assert (found.kind, found.ranks) == ("params-not-restored", (0, 1))
    same_params = [run(range(3, 7), {s: {"_": 0} for s in range(3, 7)}, loads=True)] * 2
    shifted = [tuple({**e, "ids": [0]} if e["ev"] == Ev.BATCH else e for e in t)
               for t in same_params]
    found = compare(whole, stopped, shifted, 2)
    assert (found.kind, found.measured["step"]) == ("sampler-not-restored", 3)


def test_what_two_runs_from_the_start_disagree_on_is_not_compared():
    """numpy's state, seeded by the OS: left out; the batches read: the run is not
    deterministic in its data, and nothing can be compared."""
    whole = [run(range(1, 7))] * 2
    numpy_moves = {s: {"rng_numpy": f"os{s}"} for s in range(1, 7)}
    stopped = [run(range(1, 3), numpy_moves, saves=(2,))] * 2
    assert compare(whole, stopped, [run(range(3, 7), numpy_moves, loads=True)] * 2, 2).ok
    shuffled = [tuple({**e, "ids": [7]} if e["ev"] == Ev.BATCH else e
                      for e in run(range(1, 3), saves=(2,)))] * 2
    found = compare(whole, shuffled, [run(range(3, 7), loads=True)] * 2, 2)
    assert found.kind == "not-deterministic" and "(in batch)" in found.summary


def noisy(steps: range, scale: float, changes: dict[int, dict] | None = None, **kwargs):
    """A run whose float sums differ from another's by ``scale`` relative: its digests
    differ everywhere, its values by that much (plus ``changes``)."""
    values = {step: {"params": f"p{step}~{scale}", "grads": f"g{step}~{scale}",
                     "optimizer_state": f"o{step}~{scale}",
                     "params_sample": [1.0 + scale, -2.0], "grads_sample": [0.5 * (1 + scale)],
                     "optimizer_state_sample": [0.25, 3.0 * (1 + scale)],
                     **(changes or {}).get(step, {})} for step in steps}
    return run(steps, values, **kwargs)


def test_a_run_that_is_not_deterministic_is_compared_within_its_stated_tolerance():
    """Two runs from the start differ by 1e-7 relative: the states with values are
    compared within 1e-3 (100x that, at least 1e-3), the settings and batches bitwise."""
    whole = [noisy(range(1, 7), 0.0)] * 2
    stopped = [noisy(range(1, 3), 1e-7, saves=(2,))] * 2
    found = compare(whole, stopped, [noisy(range(3, 7), 3e-6, loads=True)] * 2, 2)
    assert found.ok, found.summary
    assert found.measured["tolerance"] == 1e-3
    assert found.measured["noise"] == pytest.approx(1e-7, rel=1e-3)
    assert found.measured["within_tolerance"] == ["params", "optimizer_state", "grads"]
    assert "within a relative 1e-03, as the script is not deterministic" in found.summary
    lost = {4: {"optimizer_state_sample": [0.0, 0.0]}}  # momentum from zero: off by all of it
    found = compare(whole, stopped, [noisy(range(3, 7), 3e-6, loads=True),
                                     noisy(range(3, 7), 3e-6, lost, loads=True)], 2)
    assert (found.ok, found.kind, found.ranks) == (False, "optimizer-state-not-restored", (1,))
    assert found.measured["relative_difference"] == 1.0
    assert "by 1 relative, beyond the tolerance of 1e-03" in found.summary
    lr = {3: {"settings": [{"lr": 0.2}]}}  # a setting is compared bitwise still
    found = compare(whole, stopped, [noisy(range(3, 7), 3e-6, lr, loads=True)] * 2, 2)
    assert (found.kind, found.measured["step"]) == ("scheduler-not-restored", 3)


def test_the_tolerance_grows_with_the_noise_the_runs_show():
    whole = [noisy(range(1, 7), 0.0)] * 2
    stopped = [noisy(range(1, 3), 1e-4, saves=(2,))] * 2
    found = compare(whole, stopped, [noisy(range(3, 7), 5e-3, loads=True)] * 2, 2)
    assert found.ok and found.measured["tolerance"] == pytest.approx(1e-2, rel=1e-3)
    found = compare(whole, stopped, [noisy(range(3, 7), 5e-2, loads=True)] * 2, 2)
    assert found.kind == "params-not-restored" and found.measured["relative_difference"] > 1e-2


def test_a_run_that_starts_over_or_resumes_at_another_step_is_named():
    whole = [run(range(1, 7))] * 2
    stopped = [run(range(1, 3), saves=(2,))] * 2
    over = compare(whole, stopped, [run(range(1, 7))] * 2, 2)
    assert over.kind == "not-resumed" and "it started over" in over.summary
    short = compare(whole, stopped, [run(range(3, 6), loads=True)] * 2, 2)
    assert short.kind == "resumed-at-another-step" and short.measured == {"made": 3, "expected": 4}


def test_a_sample_is_every_kth_value_of_the_tensors_end_to_end_without_joining_them():
    import torch

    from distdoctor.trace.resume import SAMPLED, _sample

    tensors = [torch.arange(10.0), torch.empty(0), torch.arange(10.0, 20.0).reshape(2, 5),
               torch.arange(20.0, 100.0)]
    joined = torch.cat([t.reshape(-1) for t in tensors])
    assert _sample(tensors) == joined[::100 // SAMPLED][:SAMPLED].tolist()
    assert _sample([torch.tensor([1.5, 2.5])]) == [1.5, 2.5] and _sample([]) == []


def test_float_rounding_a_restart_brings_is_not_a_state_lost():
    """A deterministic script whose resumed run sums a reduction in another order (DDP's
    first iteration at 3 ranks): the gradients' digests differ, their values by 1e-8
    relative, and every later state carries it, some too little to reach the sample. That
    is rounding, said; a value off by 1e-3 is a lost state, and so are equal samples of
    other digests before any rounding showed."""
    exact = {step: {"params_sample": [1.0, -2.0], "grads_sample": [0.5],
                    "optimizer_state_sample": [0.25]} for step in range(1, 7)}
    whole = [run(range(1, 7), exact)] * 2
    stopped = [run(range(1, 3), exact, saves=(2,))] * 2
    rounded = {**{s: dict(exact[s]) for s in range(3, 7)},
               3: {**exact[3], "grads": "g3'", "grads_sample": [0.5 * (1 + 1e-8)]},
               4: {**exact[4], "params": "p4'"}}  # its sampled values are still equal
    found = compare(whole, stopped, [run(range(3, 7), rounded, loads=True)] * 2, 2)
    assert found.ok, found.summary
    assert found.measured["rounding"] == {"grads": pytest.approx(1e-8, rel=1e-2),
                                          "params": 0.0}
    assert "but for float rounding in the gradients and parameters" in found.summary
    lost = {**rounded, 3: {**exact[3], "grads": "g3'", "grads_sample": [0.5 * (1 + 1e-3)]}}
    found = compare(whole, stopped, [run(range(3, 7), lost, loads=True)] * 2, 2)
    assert (found.ok, found.kind, found.measured["step"]) == (False, "state-not-restored", 3)
    unseen = {**{s: dict(exact[s]) for s in range(3, 7)}, 3: {**exact[3], "params": "p3'"}}
    found = compare(whole, stopped, [run(range(3, 7), unseen, loads=True)] * 2, 2)
    assert (found.ok, found.kind) == (False, "params-not-restored")
