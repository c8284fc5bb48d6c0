"""What sharding costs in step time and saves in memory, against DDP on the same model.

Every data-parallel strategy trains the same MLP (scaled up so compute is not lost in
call overhead) with Adam on warm pools, the strategies alternating round by round so
machine noise hits them all alike. A step's time is the slowest rank's wall time for
forward, backward, gradient sync and optimiser step; the result is each strategy's
median step time and its measured bytes of state per rank, as ratios to hand-rolled DDP
measured in the same run. Held bytes are the most any rank held at its last step, so
ZeroRedundancyOptimizer's whole-tensor partition shows its fullest rank.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from distdoctor.cli.args import count  # noqa: E402
from distdoctor.faultloop.runspec import run  # noqa: E402
from distdoctor.models import RunRecord, RunSpec  # noqa: E402
from distdoctor.models.strategies import stage_of  # noqa: E402

STRATEGIES = ("ddp", "torch-ddp", "zero1", "zero2", "zero3", "torch-zero", "fsdp2",
              "fsdp2-grad-op")
WARMUP_STEPS = 2


def step_seconds(record: RunRecord) -> list[float]:
    """Per step after the warm-up, the slowest rank's time."""
    steps = {}
    for rank in record.ranks:
        for s in rank.evidence.steps:
            if s.step > WARMUP_STEPS:
                steps[s.step] = max(steps.get(s.step, 0.0), s.seconds)
    return [steps[k] for k in sorted(steps)]


def model_shape(record: RunRecord) -> str:
    memory = record.ranks[0].evidence.memory[-1]
    return (f"P = {memory.model_params} parameters in {memory.layers} layers, the largest "
            f"{memory.largest_layer} ({memory.largest_layer / memory.model_params:.0%})")


def held_bytes(record: RunRecord) -> int:
    """The most any rank held at its last step."""
    return max(r.evidence.memory[-1].total for r in record.ranks)


def measure(world_size: int, hidden: int, steps: int, rounds: int) -> None:
    spec = {name: RunSpec(strategy=name, world_size=world_size, optimizer="adam",
                          in_features=64, hidden_features=hidden, batch_size=32,
                          num_samples=32 * world_size * steps, num_steps=steps,
                          fingerprint_values=16)
            for name in STRATEGIES}
    times: dict[str, list[float]] = {name: [] for name in STRATEGIES}
    held: dict[str, int] = {}
    shape = ""
    for done in range(rounds):
        for name in STRATEGIES:
            record = run(spec[name])
            if not record.finished:
                sys.exit(f"{name} at N={world_size} did not finish: "
                         f"{[r.end.headline for r in record.ranks if not r.end.ok]}")
            times[name].append(statistics.median(step_seconds(record)))
            held[name] = held_bytes(record)
            shape = model_shape(record)
        print(f"  N={world_size}: round {done + 1} of {rounds} done", file=sys.stderr, flush=True)
    base_time = statistics.median(times["ddp"])
    print(f"N={world_size}: {shape}; fp32 Adam, {spec['ddp'].batch_size} samples per rank, "
          f"{steps - WARMUP_STEPS} timed steps x {rounds} rounds")
    print(f"{'strategy':<14} {'stage':>5} {'step ms':>8} {'vs ddp':>7} "
          f"{'held bytes':>11} {'vs ddp':>7}")
    for name in STRATEGIES:
        t = statistics.median(times[name])
        print(f"{name:<14} {stage_of(name):5d} {t * 1e3:8.2f} {t / base_time:6.2f}x "
              f"{held[name]:11d} {held[name] / held['ddp']:6.2f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=count(1), default=512, help="MLP width (default 512)")
    parser.add_argument("--steps", type=count(WARMUP_STEPS + 1), default=12,
                        help=f"steps per run, the first {WARMUP_STEPS} untimed (default 12)")
    parser.add_argument("--rounds", type=count(1), default=3, help="runs per strategy (default 3)")
    parser.add_argument("--smoke", action="store_true",
                        help="the suite's run: N=2, a small MLP, one short round")
    args = parser.parse_args()
    if args.smoke:
        args.hidden, args.steps, args.rounds = 16, WARMUP_STEPS + 1, 1
    for world_size in (2,) if args.smoke else (2, 4):
        measure(world_size, args.hidden, args.steps, args.rounds)
        print()


if __name__ == "__main__":
    main()
