"""What the checks conclude about a run, and the report the command line writes and reads
back (schema-checked, so a newer detector can re-judge an old record)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from distdoctor.models.jsoncodec import SchemaError, from_json, json_data, to_json
from distdoctor.models.record import RunRecord
from distdoctor.models.spec import RunSpec, apply_changes

# v2: the failure modes' kinds took their catalogue names (v1 said gradient-not-averaged,
# unused-parameters, sync-every-microbatch, tp-partial-sums, tp-replica-drift)
REPORT_SCHEMA = "distdoctor.report.v2"
Outcome = Literal["healthy", "unhealthy", "fixed", "not-fixed", "masked", "not-reproduced",
                  "inconclusive"]


# the causes a user of their own script is told, one name each: a check sets one on its
# finding (Finding.kind), and the report orders and words them (userjob/reporting/report.py)
CauseKind = Literal["world-size-mismatch", "duplicate-rank", "split-rendezvous",
                    "backend-mismatch", "rendezvous-mismatch", "rendezvous-incomplete",
                    "rank-never-joined", "p2p-cycle", "group-cycle", "partial-step",
                    "collective-mismatch",
                    "rank-exited-early", "rank-crashed",
                    "unused-params", "busy-rank", "hang-unknown", "missing-tp-allreduce",
                    "tp-dropout-rng", "tp-batches-differ",
                    "replicated-param-drift", "cleared-microbatches", "unsynced-microbatches",
                    "rank-dependent-update",
                    "failed-sync", "divergent-parameters",
                    "divergent-buffers",
                    "sum-without-mean", "allreduce-every-microbatch",
                    "duplicate-samples", "repeated-epoch-order", "non-finite", "tp-across-nodes",
                    "over-memory-budget", "straggler",
                    "unbalanced-stages"]
CAUSE_KINDS: tuple[str, ...] = get_args(CauseKind)
# what resume-check tells a script whose resume parts from the run that never stopped:
# the part of the state not restored, by its failure mode's name (the catalogue's resume
# faults inject four of them into the built-in workload)
ResumeCause = Literal["params-not-restored", "optimizer-state-not-restored",
                      "scheduler-not-restored", "sampler-not-restored",
                      "rng-state-not-restored", "state-not-restored", "not-resumed",
                      "resumed-at-another-step"]
RESUME_CAUSES: tuple[str, ...] = get_args(ResumeCause)


@dataclass(frozen=True, kw_only=True)
class Finding:
    """A detected failure mode, with the numbers that show it and the fix as knob changes."""

    check: str  # the detector that found it
    fault: str  # the failure mode it indicates
    symptom: str  # with the measured numbers
    cause: str
    fix: str
    fix_changes: dict[str, Any]  # dotted RunSpec path -> new value, e.g. "knobs.sampler"
    ranks: tuple[int, ...] = ()
    measured: dict[str, Any] = field(default_factory=dict)
    headline: str = ""  # the key number in a few words, for tables
    # a timing judgement whose confidence interval straddles its limit: neither a detection
    # nor a clean bill, until more is measured
    inconclusive: bool = False
    # What the report and the pictures read, set by the check itself; nothing downstream
    # reads the names inside ``measured``, which are free to change.
    kind: CauseKind | Literal[""] = ""  # the cause a user of their own script is told;
    # "" for what only the built-in workload shows (memory, a plan across nodes)
    first_step: int | None = None  # the step the symptom first shows at
    where: tuple[str, ...] = ()  # the user's lines to look at, most telling first

    def __post_init__(self) -> None:
        # held as JSON data, so a report reads back equal (see jsoncodec)
        object.__setattr__(self, "fix_changes", json_data(self.fix_changes, "fix_changes"))
        object.__setattr__(self, "measured", json_data(self.measured, "measured"))

    def apply_fix(self, spec: RunSpec) -> RunSpec:
        return apply_changes(spec, self.fix_changes)


@dataclass(frozen=True)
class ReferenceComparison:
    """Distance of the distributed run from a single-process run on the same samples."""

    max_abs_diff: float
    per_step: tuple[float, ...]
    tolerance: float = 1e-5

    @property
    def matches(self) -> bool:
        return self.max_abs_diff <= self.tolerance


@dataclass(frozen=True)
class Assessment:
    """What the checks and the reference say about one run."""

    findings: tuple[Finding, ...]
    reference: ReferenceComparison | None
    param_spread: float | None  # largest difference between replicas, any step (None: no replicas)
    ranks_finished: bool
    spread_tolerance: float = 1e-6

    @property
    def decided(self) -> tuple[Finding, ...]:
        """The findings that were decided: what counts as detected, or as remaining."""
        return tuple(f for f in self.findings if not f.inconclusive)

    @property
    def undecided(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.inconclusive)

    @property
    def healthy(self) -> bool:
        """Finished, matching the reference, and no decided finding (an inconclusive one
        makes the run neither healthy nor unhealthy: see ``decided_health``)."""
        spread_ok = self.param_spread is None or self.param_spread <= self.spread_tolerance
        reference_ok = self.reference is not None and self.reference.matches
        return self.ranks_finished and not self.decided and spread_ok and reference_ok

    @property
    def decided_health(self) -> bool:
        """Can a verdict be given? Not while a healthy-looking run has undecided findings."""
        return not (self.healthy and self.undecided)


@dataclass(frozen=True)
class Verdict:
    """The run before any fix, the run after it (if one was applied), and what that means.

    outcome: ``healthy``/``unhealthy`` for a single run; for an injected fault ``fixed``
    (found, and gone after the fix with the reference matched), ``not-fixed``, ``masked``
    (the strategy itself prevents the fault: see ``note``) or ``not-reproduced``; and
    ``inconclusive`` for either when a timing judgement stayed undecided after measuring
    more (the numbers are in the findings, marked inconclusive).
    """

    outcome: Outcome
    before: Assessment
    after: Assessment | None = None
    note: str = ""

    @property
    def passed(self) -> bool:
        return self.outcome in ("healthy", "fixed", "masked")

    @property
    def final(self) -> Assessment:
        return self.after if self.after is not None else self.before


@dataclass(frozen=True)
class RunReport:
    """What the command line writes: the run, the run after a fix (if any), the verdict."""

    record: RunRecord
    verdict: Verdict
    fixed_record: RunRecord | None = None
    fault: str | None = None  # "id" or "id:variant" when a fault was injected on purpose
    schema: str = REPORT_SCHEMA


def dump_report(report: RunReport, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(to_json(report), indent=1) + "\n")
    tmp.replace(path)


def load_report(path: str | Path) -> RunReport:
    """The report in ``path``; SchemaError, one line naming the file and the field (as
    ``$.record.spec.world_size``), for anything that does not fit."""
    try:
        data = json.loads(Path(path).read_text(errors="replace"))
    except ValueError as exc:
        raise SchemaError(f"{path}: not a JSON report ({exc})") from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != REPORT_SCHEMA:
        raise SchemaError(f"{path}: schema {schema!r}, this distdoctor reads {REPORT_SCHEMA!r}")
    try:
        return from_json(RunReport, data)
    except SchemaError as exc:
        raise SchemaError(f"{path}: {exc}".replace("\n", " ")) from None
    except (TypeError, ValueError) as exc:  # a value its record refuses (RunSpec's checks)
        raise SchemaError(f"{path}: {exc}".replace("\n", " ")) from None
