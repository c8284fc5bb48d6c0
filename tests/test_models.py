"""The data model: validation, fix transforms, and an exact JSON round trip."""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distdoctor.models import (
    REPORT_SCHEMA,
    Assessment,
    Finding,
    Knobs,
    ReferenceComparison,
    RunRecord,
    RunReport,
    RunSpec,
    Verdict,
    dump_report,
    load_report,
)
from distdoctor.models.jsoncodec import SchemaError, from_json, to_json
from distdoctor.models.spec import PipeShape

pytestmark = pytest.mark.tier("unit")


def values_of(hint):
    """Every value a field typed ``hint`` may hold, by its annotation alone: so a field
    added to any record is generated without anyone remembering to add it here."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is typing.Any:
        return json_values
    if hint in SIMPLE:
        return SIMPLE[hint]
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([values_of(a) for a in args])
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return st.lists(values_of(args[0]), max_size=2).map(tuple)
    if origin is tuple:
        return st.tuples(*map(values_of, args))
    if origin is dict:
        return st.dictionaries(values_of(args[0]), values_of(args[1]), max_size=2)
    if dataclasses.is_dataclass(hint):
        return st.deferred(lambda: RECORDS[hint] if hint in RECORDS else instances(hint))
    raise TypeError(f"no strategy for {hint!r}")


def instances(cls, **drawn):
    """``cls`` with every field drawn by its annotation, or as ``drawn`` says."""
    hints = typing.get_type_hints(cls)
    return st.builds(cls, **{f.name: drawn.get(f.name, values_of(hints[f.name]))
                              for f in dataclasses.fields(cls) if f.init})


SIMPLE = {int: st.integers(-2**53, 2**53), bool: st.booleans(), str: st.text(max_size=6),
          type(None): st.none(),
          float: st.floats(allow_nan=False, width=64)}  # inf and -inf included
# what a field typed Any holds (a finding's measured numbers): JSON data, inf included
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**53, 2**53) | SIMPLE[float] | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=2) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=4) | st.integers(0, 9), inner, max_size=2),
    max_leaves=6)


@st.composite
def specs(draw):
    """RunSpec checks its numbers against each other: drawn so that they agree."""
    micro = draw(st.integers(1, 4))
    batch = micro * draw(st.integers(1, 4))
    world = draw(st.integers(1, 4))
    pipe = draw(st.builds(PipeShape, layers=st.text("ma", min_size=1, max_size=6),
                          seq_len=st.integers(1, 64), d_model=st.integers(1, 64)))
    strategy = draw(st.sampled_from(["ddp", "torch-ddp", "zero3", "pipe-1f1b"]))
    global_batch = batch if "pipe-" in strategy else world * batch
    return RunSpec(
        strategy=strategy, world_size=world, backend=draw(st.sampled_from(["gloo", "nccl"])),
        num_steps=draw(st.integers(1, 9)), batch_size=batch, micro_batches=micro,
        num_samples=global_batch + draw(st.integers(0, 64)),
        in_features=draw(st.integers(1, 32)), hidden_features=draw(st.integers(1, 32)),
        lr=draw(st.none() | st.floats(1e-6, 10)),
        optimizer=draw(st.sampled_from(["auto", "sgd", "adam"])), seed=draw(SIMPLE[int]),
        deadline=draw(st.floats(0.01, 1e4)), fingerprint_values=draw(st.integers(1, 4096)),
        # drawn valid, not filtered: a filter that rejects most draws fails the health check
        knobs=draw(instances(Knobs, dropout=st.floats(0, 1, exclude_max=True),
                             restart_after=st.integers(0, 9)).map(
            lambda k: dataclasses.replace(k, sequence_parallel=False) if k.dropout else k)),
        ranks_per_node=draw(st.integers(0, 8)), pipe=pipe)


RECORDS = {RunSpec: specs()}


# a RunReport is large (every record type at once): a quarter of the profile's examples
# (25 in the suite, 250 under --hypothesis-profile=explore) covers every field, as the
# test after this one checks, at a quarter of the suite's time. Drawing one takes tens of
# milliseconds, and seconds on a loaded machine (seen in a fresh clone's suite, with other
# jobs on both cores): how fast inputs are drawn is not what this tests
@settings(max_examples=max(10, settings().max_examples // 4),
          suppress_health_check=[HealthCheck.too_slow])
@given(instances(RunReport))
def test_every_report_survives_a_json_round_trip_exactly(report):
    text = json.dumps(to_json(report), allow_nan=False)  # strict JSON: no NaN, no Infinity
    assert from_json(RunReport, json.loads(text)) == report


def test_the_generator_reaches_every_field_of_every_record_type():
    """Every dataclass a report holds, found by walking the annotations from RunReport."""
    seen, todo = set(), [RunReport]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for hint in typing.get_type_hints(cls).values():
            todo += [t for t in _types_in(hint) if dataclasses.is_dataclass(t)]
    assert {c.__name__ for c in seen} >= {
        "Call", "MemoryEvidence", "StageCost", "StageEvent", "PipeStepEvidence", "Evidence",
        "RunSpec", "PipeShape", "Knobs", "Finding", "InFlight", "GradientEvidence"}
    for cls in seen:  # a strategy for every field, from its annotation alone
        for hint in typing.get_type_hints(cls).values():
            values_of(hint)


def _types_in(hint):
    yield hint
    for arg in typing.get_args(hint):
        yield from _types_in(arg)


def _finding(fix_changes: dict | None = None, **more) -> Finding:
    """A finding whose words are placeholders: what is tested is how it holds its data."""
    return Finding(check="c", fault="f", symptom="s", cause="c", fix="fix",
                   fix_changes=fix_changes or {}, **more)


def test_measured_values_are_held_as_the_json_that_reads_back():
    finding = _finding(measured={
        "cycle": (0, 1), "reached": {0: 4}, "ratio": math.inf, "n": np.int64(3)})
    assert finding.measured == {"cycle": [0, 1], "reached": {"0": 4}, "ratio": math.inf,
                                "n": 3}
    text = json.dumps(to_json(finding), allow_nan=False)
    assert '"ratio": {"$float": "inf"}' in text
    assert from_json(Finding, json.loads(text)) == finding
    with pytest.raises(TypeError, match="measured.where: object is not JSON data"):
        _finding(measured={"where": object()})


def test_a_nan_among_the_measured_numbers_reads_back_as_nan():
    finding = _finding(measured={"loss": math.nan})
    back = from_json(Finding, json.loads(json.dumps(to_json(finding), allow_nan=False)))
    assert math.isnan(back.measured["loss"])


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
    finding = _finding(fix_changes={"knobs.average_gradients": True,
                                 "knobs.aux_skipped_on": "none"})
    fixed = finding.apply_fix(spec)
    assert fixed.knobs == Knobs() and spec.knobs.average_gradients is False
    with pytest.raises(KeyError):
        _finding(fix_changes={"knobs.nope": 1}).apply_fix(spec)


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(schema="distdoctor.report.v99"), "schema 'distdoctor.report.v99'"),
    (lambda d: d["record"]["spec"].update(colour=1),
     r"\$.record.spec: unknown fields \['colour'\] for RunSpec"),
    (lambda d: d["record"]["spec"].update(world_size="two"),
     r"\$.record.spec.world_size: expected an integer, got 'two'"),
    (lambda d: d["record"]["spec"].update(world_size=0), "world-size must be at least 1"),
    (lambda d: d["verdict"].pop("outcome"), r"\$.verdict: missing field 'outcome'"),
])
def test_a_report_that_does_not_fit_is_one_line_naming_the_file_and_field(tmp_path, change,
                                                                          message):
    path = tmp_path / "r.json"
    dump_report(RunReport(RunRecord(RunSpec(), (), 0.5),
                          Verdict("healthy", Assessment((), None, None, True))), path)
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    with pytest.raises(SchemaError, match=message) as refused:
        load_report(path)
    assert str(refused.value).startswith(f"{path}: ") and "\n" not in str(refused.value)


def test_a_report_that_is_not_json_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / "r.json"
    path.write_bytes(b'{"schema": "distdoctor.report.v2", \xff')
    with pytest.raises(SchemaError, match=f"{path}: not a JSON report"):
        load_report(path)
