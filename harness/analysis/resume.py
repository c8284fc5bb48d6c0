"""A resumed run against the same run never stopped: the invariant that a run interrupted
after its K-th checkpoint and resumed from it trains, from the next step on, exactly as
if it had never stopped.

The evidence is each rank's trace under resume-check (trace/resume.py): before each
optimiser step, digests of what a resume must restore; each save and load; each RNG state
set. The interrupted run's K-th save says at which step S the checkpoint was taken; the
resumed run's step j is then the uninterrupted run's step S + j. The first step and the
first thing, in the order a step depends on them, whose digests differ name what was not
restored: the parameters, the optimiser's state, its settings (the learning rate: a
scheduler), the sampler's epoch, an RNG state, and last the gradients (all else alike: the
data the step read).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from distdoctor.models.calls import ranks_phrase, relative_line
from distdoctor.models.events import Ev
from distdoctor.models.verdict import ResumeCause

# what a step depends on, in the order a difference is blamed: (key, what it is, why it
# differs, what to save and restore). "data" is the last batch the step read (its
# sampler's epoch and its sample ids); "rng" is blamed only where the gradients differ
# with it: an RNG state nothing draws from is harmless.
RESTORED: tuple[tuple[str, ResumeCause, str, str, str], ...] = (
    ("params", "params-not-restored", "the model's parameters",
     "the model's state is not restored from the checkpoint (or from another step's)",
     "save model.state_dict() and load it on every rank before training resumes"),
    ("optimizer_state", "optimizer-state-not-restored", "the optimiser's state",
     "the optimiser's state (momentum, Adam's moments) is not restored on these ranks",
     "save optimizer.state_dict() and load it on every rank"),
    ("settings", "scheduler-not-restored", "the optimiser's settings (the learning rate)",
     "the learning-rate schedule is not restored: the scheduler starts over",
     "save scheduler.state_dict() and load it on every rank (or step it to the resumed "
     "step)"),
    ("epoch", "sampler-not-restored", "the sampler's epoch",
     "the DistributedSampler is not told the resumed epoch, so it deals another order",
     "call sampler.set_epoch(epoch) with the checkpoint's epoch before iterating"),
    ("batch", "sampler-not-restored", "the batch the step read",
     "the data loader's position is not restored: the resumed run reads other samples "
     "than the uninterrupted run at the same step",
     "resume the loader where the checkpoint's step left it: the same epoch, and the "
     "batches it already read skipped"),
    ("rng", "rng-state-not-restored", "the RNG state and the gradients with it",
     "each rank's own RNG state is not restored, so what draws from it (dropout, random "
     "data) draws other numbers",
     "save each rank's own RNG states (torch.get_rng_state(), and numpy's and random's if "
     "used) in a file per rank, and restore each rank's own"),
    ("grads", "state-not-restored", "the gradients",
     "the step computed other gradients from the same parameters, optimiser and data: "
     "state the checkpoint does not hold (a buffer, a generator of the script's own), or "
     "a computation that is not deterministic",
     "save and restore every state the step reads (model buffers, the script's own "
     "generators), or check the run is deterministic (torch.use_deterministic_algorithms)"),
)
RNG_KEYS = ("rng_torch", "rng_numpy", "rng_python")
# the states also recorded as a few values each, comparable within a tolerance where two
# runs of the script are not bitwise alike (float sums in another order: a GPU's atomics,
# micro-batches in arrival order)
SAMPLES = {"params": "params_sample", "grads": "grads_sample",
           "optimizer_state": "optimizer_state_sample"}
# The tolerance of a non-deterministic run: a relative difference of 1e-3, or 100x what
# two runs from the start already differ by before the checkpoint where that is more. Float
# noise of summation order is about 1e-7 relative and grows slowly over a few steps; a
# state not restored moves values by a whole update or more (Adam's moments from zero,
# another rank's dropout masks: 1e-2 to 1).
RELATIVE_FLOOR = 1e-3
NOISE_FACTOR = 100
# Float rounding a restart may bring even to a deterministic script: a restarted job can
# reduce in another order (DDP's first iteration buckets the gradients in the order of the
# parameters, the run never stopped in the order its backward produced them; at 3 ranks or
# more the sums then round differently, about 1e-8 relative). A value that differs bitwise
# by more than nothing and at most this much, relative, is that rounding; a state not
# restored moves values by 1e-3 or more. Equal samples with other digests differ outside
# the sample: a difference, unless rounding already showed in the run (then every later
# state carries some, too small to reach the sampled values).
ROUNDING = 1e-5
PLURAL = {"params", "settings", "rng", "grads"}  # (what is said of them: "differ")
COMPARED = ("params", "optimizer_state", "settings", "epoch", "batch", "grads")


@dataclass(frozen=True)
class Resumption:
    """What resume-check found: a difference (the first), or none, and what it compared."""

    ok: bool
    summary: str
    fix: str = ""
    # the failure mode of the first difference (a ResumeCause; measured["part"] says which
    # part of the state), or "not-deterministic": why it could not be compared
    kind: str = ""
    ranks: tuple[int, ...] = ()
    checkpoint_step: int = 0  # S: the optimiser steps done when the K-th save returned
    compared_steps: tuple[int, int] = (0, 0)  # the uninterrupted run's steps compared
    lines: tuple[str, ...] = ()  # where it was saved or restored
    measured: dict = field(default_factory=dict)


def states(trace: tuple[dict, ...]) -> list[dict]:
    return [e for e in trace if e.get("ev") == Ev.STATE]


def events(trace: tuple[dict, ...], kind: str) -> list[dict]:
    return [e for e in trace if e.get("ev") == kind]


def checkpoint_step(interrupted: list[tuple[dict, ...]], at: int) -> int | None:
    """The optimiser steps done when the K-th checkpoint was written (the first rank to
    write its K-th), or None where no rank saved K times."""
    steps = [e["step"] for trace in interrupted for e in events(trace, Ev.SAVE)
             if e.get("n") == at]
    return min(steps) if steps else None


def step_records(trace: tuple[dict, ...]) -> dict[int, dict]:
    """Each optimiser step's digests, with the last batch read before it (its sampler's
    epoch and sample ids) as ``epoch`` and ``batch``."""
    last: dict[int, dict] = {}
    for e in events(trace, Ev.BATCH):
        last[e.get("steps", 0)] = e
    found = {}
    for e in states(trace):
        batch = last.get(e["step"] - 1, {})
        found[e["step"]] = {**e, "epoch": batch.get("sampler_epoch"), "batch": batch.get("ids")}
    return found


def unsteady(uninterrupted: list[tuple[dict, ...]], interrupted: list[tuple[dict, ...]],
             step: int) -> set[str]:
    """What differs between two runs from the start, up to the checkpoint's step: the same
    script twice, so what differs is not deterministic (numpy's and random's state, seeded
    from the OS when the script does not seed them) and cannot be compared bitwise."""
    found = set()
    for w, i in zip(map(step_records, uninterrupted), map(step_records, interrupted)):
        for at in range(1, step + 1):
            if at in w and at in i:
                found |= {key for key in (*RNG_KEYS, *COMPARED) if w[at].get(key) != i[at].get(key)}
    return found


def compare(uninterrupted: list[tuple[dict, ...]], interrupted: list[tuple[dict, ...]],
            resumed: list[tuple[dict, ...]], step: int) -> Resumption:
    """The resumed run's steps against the uninterrupted run's from step ``step`` + 1,
    bitwise, in what two runs from the start agree on up to the checkpoint."""
    shaky = unsteady(uninterrupted, interrupted, step)
    moving = [key for key in COMPARED if key in shaky]
    exact = [key for key in moving if key not in SAMPLES]
    if exact:
        return Resumption(False, f"two runs from the start already differ before the "
                          f"checkpoint (in {', '.join(exact)}): the script is not "
                          f"deterministic in what it reads or sets, so a resume cannot be "
                          f"compared with the run never stopped",
                          "seed every generator the step reads (torch.manual_seed, and "
                          "numpy's and random's), and use deterministic algorithms",
                          "not-deterministic", checkpoint_step=step)
    noise = _noise(uninterrupted, interrupted, step) if moving else 0.0
    tolerance = max(RELATIVE_FLOOR, NOISE_FACTOR * noise) if moving else None

    rounded: dict[str, float] = {}  # state -> the largest rounding let through

    def differs(key: str, w: dict, a: dict) -> bool:
        """Bitwise, but for float rounding in the states with values; within the tolerance
        once the run is not deterministic (a trace without values: bitwise still)."""
        sampled = SAMPLES.get(key)
        if sampled is None or w.get(sampled) is None or a.get(sampled) is None:
            return w.get(key) != a.get(key)
        gap = relative_gap(w[sampled], a[sampled])
        if tolerance is not None:
            return gap > tolerance
        if w.get(key) == a.get(key):
            return False
        if gap <= ROUNDING and (gap > 0 or rounded):  # (once rounding entered the run,
            rounded[key] = max(gap, rounded.get(key, 0.0))  # each later state carries it)
            return False
        return True

    rng_keys = [key for key in RNG_KEYS if key not in shaky]
    whole = [step_records(t) for t in uninterrupted]
    after = [step_records(t) for t in resumed]
    for records in (*whole, *after):
        for record in records.values():
            record["rng"] = tuple(record.get(k) for k in rng_keys)
    total = max((max(w, default=0) for w in whole), default=0)
    made = max((max(a, default=0) for a in after), default=0)
    loads = _lines(resumed, Ev.LOAD)
    if not loads and made >= total > step:
        return Resumption(False, f"the resumed run loaded no checkpoint (no torch.load) and "
                          f"made {made} steps, as many as the whole run: it started over "
                          f"instead of resuming from step {step}",
                          "load the last checkpoint at start-up when one exists, and "
                          "continue from its step", "not-resumed", checkpoint_step=step)
    rng_apart: dict[int, int] = {}  # rank -> the first step its RNG state differed
    for j in range(1, made + 1):
        at = step + j
        pairs = [(rank, w[at], a[j]) for rank, (w, a) in enumerate(zip(whole, after))
                 if at in w and j in a]
        for rank, w, a in pairs:
            if w["rng"] != a["rng"]:
                rng_apart.setdefault(rank, at)
        for key, name, what, why, fix in RESTORED:
            if key == "rng":
                parted = tuple(r for r, w, a in pairs if differs("grads", w, a)
                               and w["rng"] != a["rng"])
            else:
                parted = tuple(r for r, w, a in pairs if differs(key, w, a))
            if not parted:
                continue
            measured: dict = {"step": at, "ranks": list(parted), "part": key}
            if key in ("settings", "epoch"):
                rank = parted[0]
                measured.update(uninterrupted=whole[rank][at].get(key),
                                resumed=after[rank][j].get(key))
            if key == "rng":
                first_w, first_a = whole[parted[0]][at], after[parted[0]][j]
                measured.update(which=[k.removeprefix("rng_") for k in rng_keys
                                       if first_w.get(k) != first_a.get(k)])
            lines = _where(key, resumed, interrupted)
            said = f" ({_values(measured)})" if "resumed" in measured else ""
            if tolerance is not None and key in SAMPLES:
                w, a = whole[parted[0]][at], after[parted[0]][j]
                gap = relative_gap(w.get(SAMPLES[key]) or [], a.get(SAMPLES[key]) or [])
                measured.update(relative_difference=gap if gap != float("inf") else None,
                                tolerance=tolerance)
                said = (f" (by {gap:.2g} relative, beyond the tolerance of {tolerance:.0e} of "
                        f"this non-deterministic script)" if gap != float("inf") else
                        " (empty after the resume, or of another size: not the same state)")
            return Resumption(
                False, f"{ranks_phrase(parted)}: {what} at step {at} after the resume "
                f"differ{'' if key in PLURAL else 's'} from the "
                f"uninterrupted run's{said}: {why}"
                + (f"; {'; '.join(lines)}" if lines else ""),
                fix, name, parted, step, (step + 1, at), tuple(lines), measured)
    if made + step != total:
        return Resumption(False, f"the resumed run made {made} steps after step {step}, "
                          f"where the uninterrupted run made {total - step}: it resumed from "
                          f"another step than its checkpoint's",
                          "resume from the checkpoint's own step (save the step with it)",
                          "resumed-at-another-step", checkpoint_step=step,
                          measured={"made": made, "expected": total - step})
    note = ""
    if rng_apart:
        note = (f"; {ranks_phrase(sorted(rng_apart))}' RNG state differs from step "
                f"{min(rng_apart.values())}, harmless while nothing draws from it in "
                f"training, but not restored")
    compared = f"step {total}" if total == step + 1 else f"steps {step + 1}-{total}"
    measured = {"rng_apart": {str(r): s for r, s in rng_apart.items()}}
    if tolerance is None:
        rounding = ""
        if rounded:
            rounding = (f", but for float rounding in the {_and(list(rounded))} (up to "
                        f"{max(rounded.values()):.1e} relative, within {ROUNDING:.0e}: a "
                        f"restarted job may sum its reductions in another order)")
        return Resumption(True, f"resumed after step {step} and matched the uninterrupted "
                          f"run bitwise at {compared} on every rank (parameters, "
                          f"gradients, optimiser state and settings, the batches "
                          f"read){rounding}{note}",
                          checkpoint_step=step, compared_steps=(step + 1, total),
                          measured={**measured, "rounding": rounded})
    return Resumption(True, f"resumed after step {step} and matched the uninterrupted run at "
                      f"{compared} on every rank: the optimiser's settings and the batches "
                      f"read bitwise, the {_and(moving)} within a relative {tolerance:.0e}, "
                      f"as the script is not deterministic (two runs from the start already "
                      f"differ in them by up to {noise:.1e} relative before the checkpoint; "
                      f"the tolerance is {NOISE_FACTOR}x that, at least "
                      f"{RELATIVE_FLOOR:.0e}){note}",
                      checkpoint_step=step, compared_steps=(step + 1, total),
                      measured={**measured, "tolerance": tolerance, "noise": noise,
                                "within_tolerance": moving})


def relative_gap(a: list[float], b: list[float]) -> float:
    """The largest difference between two samples of a state, relative to its largest
    value (infinite where their lengths differ: not the same state)."""
    if len(a) != len(b):
        return float("inf")
    if not a:
        return 0.0
    scale = max(max(map(abs, a)), max(map(abs, b)), 1e-12)
    return max(abs(x - y) for x, y in zip(a, b)) / scale


def _noise(uninterrupted: list[tuple[dict, ...]], interrupted: list[tuple[dict, ...]],
           step: int) -> float:
    """The largest relative difference between two runs from the start, up to the
    checkpoint's step, over the states recorded with values."""
    gaps = [0.0]
    for w, i in zip(map(step_records, uninterrupted), map(step_records, interrupted)):
        for at in range(1, step + 1):
            if at in w and at in i:
                gaps += [relative_gap(w[at].get(k) or [], i[at].get(k) or [])
                         for k in SAMPLES.values()]
    return max(gaps)


def _and(keys: list[str]) -> str:
    names = {"params": "parameters", "grads": "gradients", "optimizer_state": "optimiser state"}
    said = [names.get(k, k) for k in keys]
    return said[0] if len(said) == 1 else ", ".join(said[:-1]) + " and " + said[-1]


def _values(measured: dict) -> str:
    """What differs, uninterrupted then resumed: the settings that differ (``lr 0.05 vs
    0.1``), or the sampler's epoch."""
    before, after = measured["uninterrupted"], measured["resumed"]
    if isinstance(before, list) and isinstance(after, list):
        said = [f"{key} {b[key]} uninterrupted, {a[key]} resumed"
                for b, a in zip(before, after) for key in b if b.get(key) != a.get(key)]
        if said:
            return "; ".join(said)
    return f"{before} uninterrupted, {after} resumed"


def _lines(traces: list[tuple[dict, ...]], kind: str) -> dict[str, list[int]]:
    """Each line of an event kind, with the ranks that made it there."""
    found: dict[str, list[int]] = {}
    for rank, trace in enumerate(traces):
        for e in events(trace, kind):
            ranks = found.setdefault(e.get("where") or "?", [])
            if rank not in ranks:
                ranks.append(rank)
    return found


def _where(key: str, resumed: list[tuple[dict, ...]],
           interrupted: list[tuple[dict, ...]]) -> list[str]:
    """Where the checkpoint was saved and loaded (and, for an RNG state, set), with the
    ranks that did it: the lines to look at."""
    world = len(resumed)
    said = []

    def by(lines: dict[str, list[int]], verb: str) -> None:
        for line, ranks in lines.items():
            who = "every rank" if len(ranks) == world else f"{ranks_phrase(ranks)} only"
            said.append(f"{verb} by {who} at {relative_line(line)}")

    by(_lines(interrupted, Ev.SAVE), "saved")
    by(_lines(resumed, Ev.LOAD), "loaded")
    if key == "rng":
        by(_lines(resumed, Ev.RNG), "its state set")
    return said
