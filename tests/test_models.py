"""The data model: validation, fix transforms, and an exact JSON round trip."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.models.jsoncodec import SchemaError, from_json, to_json
from harness.models import (
    REPORT_SCHEMA, Assessment, BackwardEvidence, Evidence, Finding, Fingerprint, Frame, Knobs,
    RankEnd, RankRecord, ReferenceComparison, RunRecord, RunReport, RunSpec, StepEvidence,
    ThreadStack, Verdict, dump_report, load_report,
)

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
fingerprints = st.builds(Fingerprint, numel=st.integers(0, 10**9), digest=st.text(max_size=16),
                         norm=st.floats(min_value=0, allow_nan=False),
                         values=st.lists(finite, max_size=8).map(tuple))
steps = st.builds(
    StepEvidence, step=st.integers(1, 100), epoch=st.integers(0, 10),
    sample_ids=st.lists(st.integers(0, 10**6), max_size=8).map(tuple), loss=finite,
    params=fingerprints, grad_local=st.none() | fingerprints, grad_synced=st.none() | fingerprints,
    allreduce_calls=st.integers(0, 9), allreduce_bytes=st.integers(0, 10**12),
    gradient_bytes=st.integers(0, 10**12))
backwards = st.builds(BackwardEvidence, step=st.integers(1, 100),
                      no_grad_params=st.lists(st.text(max_size=12), max_size=3).map(tuple))
frames = st.builds(Frame, file=st.text(max_size=20), line=st.integers(0, 10**5),
                   function=st.text(max_size=10), code=st.text(max_size=20))
ends = st.builds(RankEnd, rank=st.integers(0, 7),
                 status=st.sampled_from(["finished", "raised", "died", "hung", "stopped"]),
                 at=st.none() | finite, error=st.none() | st.text(max_size=40),
                 exitcode=st.none() | st.integers(-64, 255),
                 stacks=st.lists(st.builds(ThreadStack, name=st.text(max_size=8),
                                           main=st.booleans(),
                                           frames=st.lists(frames, max_size=3).map(tuple)),
                                 max_size=2).map(tuple),
                 raw_stack=st.none() | st.text(max_size=40), stderr=st.text(max_size=40))
specs = st.builds(RunSpec, strategy=st.sampled_from(["ddp", "torch-ddp"]),
                  world_size=st.integers(1, 4), num_steps=st.integers(1, 9), seed=st.integers(),
                  knobs=st.builds(Knobs, sampler=st.sampled_from(["distributed", "shared-seed"]),
                                  average_gradients=st.booleans(),
                                  aux_skipped_on=st.sampled_from(["none", "odd-ranks"])))
findings = st.builds(Finding, check=st.text(max_size=8), fault=st.text(max_size=8),
                     symptom=st.text(max_size=20), cause=st.text(max_size=20),
                     fix=st.text(max_size=20),
                     fix_changes=st.just({"knobs.average_gradients": True}),
                     ranks=st.lists(st.integers(0, 7), max_size=3).map(tuple),
                     measured=st.dictionaries(st.text(max_size=6), finite | st.text(max_size=6),
                                              max_size=3), headline=st.text(max_size=12))
assessments = st.builds(Assessment, findings=st.lists(findings, max_size=2).map(tuple),
                        reference=st.none() | st.builds(
                            ReferenceComparison, max_abs_diff=finite,
                            per_step=st.lists(finite, max_size=3).map(tuple)),
                        param_spread=st.none() | finite, ranks_finished=st.booleans())


@st.composite
def reports(draw):
    spec = draw(specs)
    ranks = tuple(RankRecord(r, draw(ends), Evidence(
        r, draw(st.none() | fingerprints), draw(st.none() | fingerprints),
        tuple(draw(st.lists(backwards, max_size=2))), tuple(draw(st.lists(steps, max_size=2)))))
                  for r in range(spec.world_size))
    record = RunRecord(spec, ranks, wall_s=draw(finite), torch_version="2.13.0")
    verdict = Verdict(draw(st.sampled_from(["healthy", "fixed", "masked", "not-fixed"])),
                      draw(assessments), draw(st.none() | assessments), draw(st.text(max_size=9)))
    return RunReport(record=record, verdict=verdict, fixed_record=draw(st.none() | st.just(record)),
                     fault=draw(st.none() | st.just("sum-without-mean:sum")))


@given(reports())
def test_every_report_survives_a_json_round_trip_exactly(report):
    text = json.dumps(to_json(report))
    assert from_json(RunReport, json.loads(text)) == report


def test_infinities_survive_the_round_trip():
    comparison = ReferenceComparison(math.inf, (0.0, math.inf))
    assert from_json(ReferenceComparison, json.loads(json.dumps(to_json(comparison)))) == comparison


def test_report_files_carry_the_schema_and_refuse_another(tmp_path):
    spec = RunSpec()
    report = RunReport(RunRecord(spec, (), 0.5),
                       Verdict("healthy", Assessment((), None, None, True)))
    path = tmp_path / "deep" / "r.json"
    dump_report(report, path)
    assert json.loads(path.read_text())["schema"] == REPORT_SCHEMA
    assert load_report(path) == report
    path.write_text(path.read_text().replace(REPORT_SCHEMA, "distdoctor.report.v0"))
    with pytest.raises(SchemaError, match="v0"):
        load_report(path)


@pytest.mark.parametrize("data, message", [
    ({"strategy": "ddp", "colour": 1}, "unknown fields"),
    ({"world_size": "2"}, "expected an integer"),
    ({"knobs": {"sampler": "random"}}, "is not one of"),
    ({"knobs": {"aux_skipped_on": ["odd-ranks"]}}, "is not one of"),
])
def test_reading_refuses_documents_that_do_not_fit(data, message):
    with pytest.raises(SchemaError, match=message):
        from_json(RunSpec, data)


@pytest.mark.parametrize("changes, message", [
    (dict(world_size=0), "world-size must be at least 1"),
    (dict(num_steps=-1), "num-steps must be at least 1"),
    (dict(batch_size=8, micro_batches=3), "not divisible"),
    (dict(num_samples=10, world_size=2, batch_size=8), "smaller than one global batch"),
    (dict(deadline=0.0), "deadline"),
])
def test_specs_refuse_impossible_settings(changes, message):
    with pytest.raises(ValueError, match=message):
        RunSpec(**changes)


def test_a_findings_fix_is_a_knob_change_on_a_new_spec():
    spec = RunSpec(knobs=Knobs(average_gradients=False, aux_skipped_on="odd-ranks"))
    finding = Finding("c", "f", "s", "c", "fix", {"knobs.average_gradients": True,
                                                   "knobs.aux_skipped_on": "none"})
    fixed = finding.apply_fix(spec)
    assert fixed.knobs == Knobs() and spec.knobs.average_gradients is False
    with pytest.raises(KeyError):
        Finding("c", "f", "s", "c", "fix", {"knobs.nope": 1}).apply_fix(spec)
