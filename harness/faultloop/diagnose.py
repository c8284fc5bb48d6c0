"""Inject a fault, run, detect, apply the findings' fixes, run again, and judge.

The fix applied is what the findings say, never what the fault says: a fault that its
detectors miss is reported as not reproduced rather than fixed by looking up the answer.
"""

from __future__ import annotations

from typing import Callable

from distdoctor.analysis.distance import built_spread, spreads
from distdoctor.faultloop.runspec import run_decided, undecided_note
from distdoctor.faults import Fault
from distdoctor.launch.pool import RankPool
from distdoctor.models import Outcome, RunReport, RunSpec, Verdict, apply_changes
from distdoctor.models.record import RunRecord
from distdoctor.models.verdict import Assessment

# how a spec is run and assessed (a caller that diagnoses many faults may share the runs of
# a spec several fixes arrive at: the suite's fault matrix does)
Runner = Callable[[RunSpec, RankPool | None], tuple[RunRecord, Assessment]]


def diagnose(fault: Fault, base: RunSpec, variant: str | None = None,
             pool: RankPool | None = None, run_fixed: Runner = run_decided) -> RunReport:
    """The fault injected into ``base``, run on ``pool``, detected, fixed as its findings
    say, and the fixed spec run by ``run_fixed``."""
    spec = fault.inject(fault.scenario(base), variant)
    label = f"{fault.id}:{fault.variant(variant).name}"
    record, before = run_decided(spec, pool)
    if not before.decided and before.undecided:
        return RunReport(record, Verdict("inconclusive", before, note=undecided_note(before)),
                         fault=label)
    if not before.decided:
        masked = fault.masked_by.get(spec.strategy)
        outcome: Outcome = "masked" if masked and before.healthy else "not-reproduced"
        note = masked or (f"no detector fired on {spec.strategy}; the run is "
                          f"{'healthy' if before.healthy else 'unhealthy'}")
        return RunReport(record, Verdict(outcome, before, note=note + _construction(record)),
                         fault=label)
    changes = {}
    for found in before.decided:
        changes.update(found.fix_changes)
    if not changes:
        return RunReport(record, Verdict("not-fixed", before, note="no finding carries a fix"),
                         fault=label)
    fixed = apply_changes(spec, changes)
    # a fix may change the world size (more ranks to fit memory): that needs its own pool
    same_size = pool is not None and pool.world_size == fixed.world_size
    fixed_record, after = run_fixed(fixed, pool if same_size else None)
    applied = "applied " + ", ".join(f"{k}={v}" for k, v in changes.items())
    if not after.decided_health:
        verdict = Verdict("inconclusive", before, after,
                          note=f"{applied}; {undecided_note(after)}")
    else:
        verdict = Verdict("fixed" if after.healthy else "not-fixed", before, after,
                          note=applied)
    return RunReport(record, verdict, fixed_record=fixed_record, fault=label)


def _construction(record) -> str:
    """What wrapping the model did to the ranks' spread: the evidence of a masked fault."""
    built, wrapped = built_spread(record), spreads(record)
    if built is None or not wrapped or built == wrapped[0]:
        return ""
    return (f" (measured: parameter spread across ranks {built:.3g} as built, "
            f"{wrapped[0]:.3g} once {record.spec.strategy} had wrapped the model)")
