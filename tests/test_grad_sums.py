"""The sums the NaN/Inf check keeps of gradients (read at once on the CPU, in slots of
preallocated buffers elsewhere): what they hold, and when they forget."""

import gc
import math

import pytest
import torch

from distdoctor.trace.sums import CHUNK, GradSums

pytestmark = pytest.mark.tier("e2e")

# each test both ways: sums read at once (the CPU's) and kept in slots (a GPU's, here on
# the CPU so that they are tested on this machine too)
WAYS = pytest.mark.parametrize("read_cpu", [True, False], ids=["read", "slots"])


def param(*shape, dtype=torch.float32):
    return torch.nn.Parameter(torch.zeros(*shape, dtype=dtype))


@WAYS
def test_a_sum_is_the_gradients_sum_and_a_nan_anywhere_makes_it_non_finite(read_cpu):
    sums, a, b = GradSums(read_cpu), param(4, 3), param(5)
    grad = torch.arange(12.0).reshape(4, 3)
    sums.add(a, grad)
    sums.add(b, torch.tensor([1.0, 2.0, math.inf, 0.0, 0.0]))
    assert not sums.all_finite()
    taken = dict((id(p), v) for p, v in sums.take([a, b]))
    assert taken[id(a)] == float(grad.sum()) == 66.0
    assert taken[id(b)] == math.inf
    assert sums.all_finite()  # taken slots are zeroed


@WAYS
def test_a_later_sum_replaces_the_earlier_one_and_clear_forgets_all(read_cpu):
    sums, a = GradSums(read_cpu), param(2)
    sums.add(a, torch.tensor([math.nan, 1.0]))
    sums.add(a, torch.tensor([2.0, 1.0]))  # the accumulated gradient, summed again
    assert sums.all_finite()
    sums.add(a, torch.tensor([math.nan, 1.0]))
    sums.clear()
    # nothing held for a (read), or its slot zeroed (slots): no gradient is finite
    assert sums.all_finite() and sums.take([a]) == ([] if read_cpu else [(a, 0.0)])


@WAYS
def test_half_precision_is_summed_wide_enough_not_to_overflow(read_cpu):
    sums, a = GradSums(read_cpu), param(4, dtype=torch.float16)
    sums.add(a, torch.full((4,), 60000.0, dtype=torch.float16))  # 240000 > 65504
    assert sums.all_finite() and sums.take([a]) == [(a, 240000.0)]


def test_only_the_given_parameters_are_taken_and_others_keep_their_sums():
    sums, mine, theirs = GradSums(), param(1), param(1)
    sums.add(mine, torch.tensor([1.0]))
    sums.add(theirs, torch.tensor([math.nan]))
    assert [v for _, v in sums.take([mine])] == [1.0]
    assert not sums.all_finite()
    assert math.isnan(sums.take([theirs])[0][1])


@WAYS
def test_a_dead_parameters_slot_is_reused_and_its_nan_forgotten(read_cpu):
    sums, keep = GradSums(read_cpu), param(1)
    sums.add(keep, torch.tensor([1.0]))
    doomed = param(1)
    sums.add(doomed, torch.tensor([math.nan]))
    del doomed
    gc.collect()
    assert sums.all_finite()
    for _ in range(3 * CHUNK):  # parameters made and dropped: the buffers do not grow
        sums.add(param(1), torch.tensor([1.0]))
    assert sum(len(b) for b in sums._buffers.values()) == (0 if read_cpu else 1)
    assert len(sums._read) <= 2 and len(sums._watched) <= 2  # the dead ones forgotten


@WAYS
def test_more_parameters_than_a_buffer_holds_each_keep_their_own_sum(read_cpu):
    sums = GradSums(read_cpu)
    params = [param(1) for _ in range(CHUNK + 3)]
    for i, p in enumerate(params):
        sums.add(p, torch.tensor([float(i)]))
    assert [v for _, v in sums.take(params)] == [float(i) for i in range(CHUNK + 3)]


# Trains one layer in a fresh interpreter (the hooks patch torch globally) with the NaN
# recorder and the gradient recorder's schedule; at the given steps the layer's output
# gradient is made NaN, so its weight's and bias's gradients are, and the loss is not.
_SCHEDULE = r"""
import json, tempfile
import torch
from distdoctor.trace.gradients import record_gradients
from distdoctor.trace.folds import fold_nonfinite
from distdoctor.trace.nonfinite import record_nonfinite
from distdoctor.trace.steps import SMALL
from distdoctor.trace.tracer import Tracer

out = tempfile.TemporaryFile()
tracer = Tracer(out.fileno(), 0)
record_gradients(tracer)
record_nonfinite(tracer)
torch.manual_seed(0)
layer = torch.nn.Linear(200, 200)  # a weight over SMALL elements, a bias under
assert layer.weight.numel() > SMALL >= layer.bias.numel()
optimizer = torch.optim.SGD(layer.parameters(), lr=1e-3)
initial = {k: v.clone() for k, v in layer.state_dict().items()}
for step in range(1, 34):
    y = layer(torch.randn(4, 200))
    if step in (11, 32):
        y.register_hook(lambda g: g * float("nan"))
    optimizer.zero_grad()
    y.square().mean().backward()
    optimizer.step()
    layer.load_state_dict(initial)  # a NaN step leaves no NaN for the next
out.seek(0)
events = [json.loads(line) for line in out.read().decode().splitlines()]
print(json.dumps([[e.step, sorted(e.local), e.loss] for e in fold_nonfinite(events)]))
"""


def test_small_gradients_are_checked_at_every_step_large_ones_on_sampled_steps():
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", _SCHEDULE], capture_output=True, text=True,
                          timeout=60, cwd=root)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    # step 11 is not sampled (after the 8th, every 32nd is): the bias alone (the small
    # gradient its backward reaches last, watched between sampled steps); 32 is: both
    assert [(step, local) for step, local, _ in found] == [(11, ["bias"]),
                                                          (32, ["bias", "weight"])]
    assert all(math.isfinite(float(loss)) for _, _, loss in found)  # seen in the gradients
