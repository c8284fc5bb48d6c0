"""Schedule simulators against closed forms, published tables, and torch's own orders."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from torch.distributed.pipelining import schedules as torch_schedules

from distdoctor.pipeline.gantt import png_gantt, text_gantt
from distdoctor.pipeline.orders import Action, Layout, Schedule, build
from distdoctor.pipeline.simulate import (
    Costs,
    closed_form,
    gpipe_bubble_fraction,
    run_schedule,
    simulate,
)

pytestmark = pytest.mark.tier("unit")


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("micro, expected", [(8, 0.2727), (64, 0.0448)])
def test_gpipe_and_1f1b_bubble_is_n_minus_1_over_m_plus_n_minus_1(name, micro, expected):
    timeline = run_schedule(name, 4, micro)
    assert gpipe_bubble_fraction(4, micro) == pytest.approx(3 / (micro + 3))
    assert round(gpipe_bubble_fraction(4, micro), 4) == expected
    assert timeline.bubble_fraction == pytest.approx(gpipe_bubble_fraction(4, micro))


@pytest.mark.parametrize("ranks", [2, 4, 8])
@pytest.mark.parametrize("name", ["1f1b", "zb", "dualpipe", "interleaved"])
def test_per_rank_bubble_matches_the_published_form_at_uniform_costs(name, ranks):
    costs = Costs(1, 1, 1)
    timeline = run_schedule(name, ranks, 4 * ranks, costs)
    expected = {"1f1b": (ranks - 1) * 3, "zb": (ranks - 1) * (1 + 2 - 2),
                "dualpipe": (ranks / 2 - 1) * (3 + 2 - 3), "interleaved": (ranks - 1) * 3 / 2}
    assert closed_form(name, ranks, 4 * ranks, costs).bubble == pytest.approx(expected[name])
    assert [timeline.bubble(r) for r in range(ranks)] == pytest.approx([expected[name]] * ranks)


def test_a_closed_form_that_disagrees_is_shown_beside_the_simulation():
    costs = Costs(1, 2, 1)  # DeepSeek's F&B form assumes backward and weight costs it lacks
    timeline = run_schedule("dualpipe", 4, 8, costs)
    f, b, w = 1, 2, 1
    fb = f + b + w  # an F&B pair that overlaps no compute: Costs' default
    published = (4 / 2 - 1) * (fb + (b + w) - 3 * w)  # (PP/2-1)(F&B+B-3W), B the full one
    assert closed_form("dualpipe", 4, 8, costs).bubble == published == 4.0
    assert timeline.bubble(0) == 3.0  # simulated: rank 0 idles less than the form says


@pytest.mark.parametrize("name, ranks, peak, copies", [
    ("1f1b", 4, 4, 1), ("zb", 4, 4, 1), ("gpipe", 4, 8, 1), ("dualpipe", 4, 5, 2),
    ("dualpipe", 8, 9, 2), ("dualpipev", 4, 4.5, 1)])
def test_activations_and_parameter_copies_follow_deepseeks_table(name, ranks, peak, copies):
    timeline = run_schedule(name, ranks, 2 * ranks if name != "gpipe" else 8)
    assert max(timeline.peak_activations(r) for r in range(ranks)) == peak  # PP, PP+1
    assert timeline.schedule.layout.param_copies == copies


_TORCH_KIND = {"FORWARD": "F", "BACKWARD_INPUT": "B", "BACKWARD_WEIGHT": "W",
               "FULL_BACKWARD": "BW"}


def _torch_actions(actions) -> list:
    out = []
    for a in actions:
        if a is None:
            continue
        if a.sub_actions:
            out.append(("FB", tuple(_torch_actions(a.sub_actions))))
        else:
            out.append((_TORCH_KIND[a.computation_type.name], a.stage_index, a.microbatch_index))
    return out


def _ours(actions) -> list:
    return [("FB", tuple(_ours(a.parts))) if a.kind == "FB" else (a.kind, a.stage, a.micro)
            for a in actions]


@pytest.mark.parametrize("ranks, micro", [(2, 4), (2, 10), (4, 8), (4, 12), (6, 12), (8, 16)])
def test_dualpipev_orders_are_torchs_action_for_action(ranks, micro):
    ours = build("dualpipev", ranks, micro)
    for rank in range(ranks):
        theirs = torch_schedules.ScheduleDualPipeV._calculate_single_rank_operations(
            SimpleNamespace(pp_group_size=ranks, _n_microbatches=micro), rank)
        assert _ours(ours.orders[rank]) == _torch_actions(theirs)


@pytest.mark.parametrize("ranks, micro", [(2, 4), (4, 8), (4, 16), (8, 16)])
def test_interleaved_orders_are_torchs_action_for_action(ranks, micro):
    ours = build("interleaved", ranks, micro)
    for rank in range(ranks):
        state = SimpleNamespace(pp_group_size=ranks, _n_microbatches=micro, n_local_stages=2,
                                microbatches_per_round=ranks, number_of_rounds=micro // ranks,
                                rank=rank)
        theirs = torch_schedules.ScheduleInterleaved1F1B._calculate_single_rank_operations(
            state, rank)
        assert _ours(ours.orders[rank]) == _torch_actions(theirs)


def test_every_schedule_runs_each_micro_batch_forward_and_backward_on_every_stage():
    for name in ("gpipe", "1f1b", "interleaved", "zb", "dualpipe", "dualpipev"):
        schedule = build(name, 4, 8)
        done = [(p.kind, p.stage, p.micro) for order in schedule.orders for a in order
                for p in (a.parts or (a,))]
        stages = len(schedule.layout.stage_rank)
        per_stage = schedule.layout.micro_per_stage
        forwards = {(s, m) for k, s, m in done if k == "F"}
        backwards = {(s, m) for k, s, m in done if k in ("B", "BW")}
        assert forwards == backwards == {(s, m) for s in range(stages) for m in range(per_stage)}
        assert len([1 for k, *_ in done if k == "F"]) == stages * per_stage


def test_an_order_that_cannot_finish_is_reported_not_looped_on():
    layout = Layout(2, (0, 1), (1, None), micro_per_stage=1)
    stuck = Schedule("stuck", layout, ((Action("BW", 0, 0), Action("F", 0, 0)),
                                       (Action("F", 1, 0), Action("BW", 1, 0))))
    with pytest.raises(RuntimeError, match="deadlocks"):
        simulate(stuck)


@pytest.mark.parametrize("name, ranks, micro, message", [
    ("interleaved", 4, 6, "divisible"), ("dualpipe", 3, 8, "even"), ("dualpipev", 4, 4, "twice"),
    ("nope", 2, 2, "unknown schedule")])
def test_impossible_shapes_are_refused(name, ranks, micro, message):
    with pytest.raises(ValueError, match=message):
        build(name, ranks, micro)


def test_the_text_chart_shows_each_rank_and_every_action():
    chart = text_gantt(run_schedule("1f1b", 4, 8)).splitlines()
    assert len(chart) == 4 and chart[3].startswith("rank 3  |.  .  .  F0 B0 B0 F1")
    assert sum(row.count("F") for row in chart) == 32


def test_png_chart_is_written_when_matplotlib_is_there(tmp_path):
    path = tmp_path / "g.png"
    pytest.importorskip("matplotlib")  # absent: png_gantt says False, tested below
    assert png_gantt(run_schedule("zb", 2, 4), str(path)) is True
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_the_png_chart_is_refused_and_nothing_written(tmp_path,
                                                                         monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    path = tmp_path / "g.png"
    assert png_gantt(run_schedule("zb", 2, 4), str(path)) is False
    assert not path.exists()


def _evaluate(formula: str, values: dict[str, float]) -> float:
    """A printed formula, such as (PP/2-1)(F&B+B-2W), evaluated with the printed values."""
    text = formula.replace("F&B", "FB").replace(")(", ")*(")
    text = re.sub(r"(\d)([A-Z(a-z])", r"\1*\2", text)
    assert re.fullmatch(r"[\d.()+\-*/ A-Za-z]+", text), formula
    return eval(text, {"__builtins__": {}}, values)  # noqa: S307 (our own printed text)


@pytest.mark.parametrize("costs", [[], ["--f", "1", "--b", "2", "--w", "0.5"],
                                   ["--f", "2", "--b", "1", "--w", "1", "--fb", "3.5"]])
def test_each_printed_formula_gives_its_printed_closed_form(capsys, costs):
    """One notation throughout: the values in the header, put into each row's formula (and
    the footer's bubble share), give the number printed beside it."""
    from distdoctor.cli.main import main

    assert main(["pipeline", "simulate", "--stages", "4", "--microbatches", "8", *costs]) == 0
    out = capsys.readouterr().out
    values = {name.replace("&", ""): float(value) for name, value in
              re.findall(r"\b(PP|M|v|F&B|F|B|W)=([\d.]+)", out.splitlines()[0])}
    assert set(values) == {"PP", "M", "v", "F", "B", "W", "FB"}
    rows = re.findall(r"^(\w+) +[\d.]+ +[\d.]+% +(\S+) +\S+ +([\d.]+)  (\([^\s,]+)", out, re.M)
    assert {name for name, *_ in rows} == {"gpipe", "1f1b", "interleaved", "zb", "dualpipe",
                                           "dualpipev"}
    share = re.search(r"closed: (\(\S+\)/\(\S+\)) for GPipe", out)[1]
    for name, closed, form_value, formula in rows:
        assert _evaluate(formula, values) == pytest.approx(float(form_value), abs=0.006), name
        if name in ("gpipe", "1f1b"):
            assert _evaluate(share, values) == pytest.approx(float(closed.rstrip("%")) / 100,
                                                             abs=0.00006)
