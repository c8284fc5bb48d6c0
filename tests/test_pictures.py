"""The HTML reports, rendered in a real browser and looked at as a person would: no console
error, the expected pictures present, a screenshot that is not blank. Runs on real ranks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from browser import CHROMIUM, MISSING, render

from distdoctor.cli.main import main

pytestmark = pytest.mark.tier("e2e")

needs_browser = pytest.mark.skipif(CHROMIUM is None, reason=MISSING)


def seen(path: Path, tmp_path: Path):
    html = path.read_text()
    assert "<script" not in html and not re.search(r'(src|href)="https?:', html)  # offline
    shown = render(path, tmp_path / (path.stem + ".png"))
    assert shown.console == [], shown.console
    assert shown.inked > 100  # drawn, not blank (a blank page's pixel data: a handful)
    return shown.dom


@needs_browser
def test_a_hang_report_shows_the_cycle_and_each_ranks_blocked_call(distdoctor, tmp_path):
    page = tmp_path / "hang.html"
    done = distdoctor("run", "--nproc-per-node", "3", "--html", str(page), "p2p_cycle.py")
    assert done.returncode == 1 and f"wrote {page}" in done.stdout
    dom = seen(page, tmp_path)
    assert "FAILED: p2p-cycle (ranks 0-2)" in dom
    assert 'id="waitgraph"' in dom and "A cycle of waits: ranks 0 -&gt; 1 -&gt; 2 -&gt; 0" in dom
    assert dom.count('class="blocked"') == 3  # each rank's open send, drawn and marked
    assert dom.count("p2p_cycle.py:9") >= 6  # on hover and in the table below
    assert "send to 1: blocked" in dom
    ddp = tmp_path / "ddp.html"  # ranks waiting in DDP's own all-reduce, which is untraced
    assert distdoctor("run", "--html", str(ddp), "ddp_barrier_on_rank0.py").returncode == 1
    dom = seen(ddp, tmp_path)
    assert "FAILED: collective-mismatch (rank 0)" in dom and "barrier: blocked" in dom
    assert "waiting in DDP's gradient all-reduce (untraced)" in dom


@needs_browser
def test_a_silent_bug_report_marks_where_the_finding_starts(tmp_path, capsys):
    page = tmp_path / "silent.html"
    assert main(["diagnose", "--strategy", "ddp", "--fault", "divergent-init",
                 "--html", str(page)]) == 0
    capsys.readouterr()
    dom = seen(page, tmp_path)
    assert "FIXED" in dom and 'id="training"' in dom and 'id="memory"' in dom
    assert "divergent-init from step 0" in dom  # the marked start
    assert "loss per rank per step" in dom and "rank 1" in dom


@needs_browser
def test_a_pipeline_report_draws_the_measured_chart_beside_the_simulated(tmp_path, capsys):
    page = tmp_path / "pipe.html"
    code = main(["pipeline", "run", "--schedule", "pipe-1f1b", "--world-size", "2",
                 "--html", str(page)])
    # a healthy pipeline: PASS, or under the suite's load a stage balance left undecided
    out = capsys.readouterr().out
    assert code == 0 or "verdict: INCONCLUSIVE" in out, out
    dom = seen(page, tmp_path)
    assert "measured: step" in dom and "simulated: 1f1b" in dom and "measured bubble" in dom
    simulated = tmp_path / "simulated.html"
    assert main(["pipeline", "simulate", "--stages", "4", "--microbatches", "8",
                 "--html", str(simulated)]) == 0
    capsys.readouterr()
    dom = seen(simulated, tmp_path)
    for name in ("gpipe", "1f1b", "interleaved", "zb", "dualpipe", "dualpipev"):
        assert f"simulated: {name}" in dom


@needs_browser
def test_a_clean_run_report_says_ok_and_draws_no_hang(distdoctor, tmp_path):
    page = tmp_path / "clean.html"
    assert distdoctor("run", "--html", str(page), "clean.py").returncode == 0
    dom = seen(page, tmp_path)
    assert "OK: all 2 ranks finished" in dom and 'id="timeline"' in dom
    assert 'id="waitgraph"' not in dom and 'class="blocked"' not in dom


@needs_browser
def test_the_demo_writes_a_page_per_case_and_an_index(tmp_path, capsys):
    folder = tmp_path / "demo"
    assert main(["demo", "divergent-init", "--world-size", "2", "--html", str(folder)]) == 0
    capsys.readouterr()
    pages = sorted(p.name for p in folder.glob("*.html"))
    assert pages == ["divergent-init-code.html",  # its lesson from code, then the knobs'
                     "divergent-init-own-seed-ddp.html", "divergent-init-own-seed-torch-ddp.html",
                     "divergent-init-own-seed-torch-zero.html", "index.html"]
    dom = seen(folder / "index.html", tmp_path)
    assert all(f'href="{name}"' in dom for name in pages if name != "index.html")
    assert "masked" in dom and "fixed" in dom


@needs_browser
def test_a_large_run_is_folded_and_says_so(tmp_path):
    """16 ranks of 400 calls each: the timeline keeps each rank's last calls and folds the
    rest into one block per rank, says so, and the page stays small."""
    from distdoctor.models import Call, Evidence, RankEnd, RankRecord, RunRecord, RunSpec
    from distdoctor.pictures import page, reports
    from distdoctor.userjob.reporting.report import report

    ranks = []
    for rank in range(16):
        calls = tuple(Call(i, rank, "all_reduce", i, tuple(range(16)), None, (), ((8,),),
                           "float32", "SUM", "train.py:12", False, 100.0 + i * 0.01,
                           completed=100.0 + i * 0.01 + 0.005) for i in range(400))
        ranks.append(RankRecord(rank, RankEnd(rank, "finished"), Evidence(rank, calls=calls)))
    record = RunRecord(RunSpec(strategy="user-script", world_size=16, num_samples=128),
                       tuple(ranks), 4.0)
    path = page.write(tmp_path / "large.html",
                      reports.script_page(record, report(record, (), "train.py"), "run"))
    assert path.stat().st_size < 1_000_000
    dom = seen(path, tmp_path)
    assert "6400 calls in all" in dom and "folded into a grey block" in dom
    assert dom.count("earlier calls, not drawn one by one") == 16


@needs_browser
def test_the_browser_check_itself_sees_console_errors_and_blank_pages(tmp_path):
    """The checks above can fail: a page whose script errs logs to the console, and an
    empty page's screenshot holds a handful of byte values."""
    broken = tmp_path / "broken.html"
    broken.write_text("<!doctype html><body><p>x</p><script>missing();</script></body>")
    blank = tmp_path / "blank.html"
    blank.write_text("<!doctype html><body></body>")
    assert any("missing is not defined" in m for m in render(broken, tmp_path / "b.png").console)
    assert render(blank, tmp_path / "blank.png").inked < 10


def test_findings_that_start_at_one_step_share_one_mark_and_the_reference_starts_at_0(
        tmp_path, capsys):
    """missing-tp-allreduce on tp-dp: the partial sums and the spread they cause both start
    at step 1, so one mark names both (two labels drawn over each other were unreadable);
    the reference chart's first point is the model as built, step 0."""
    page = tmp_path / "tp.html"
    assert main(["diagnose", "--strategy", "tp-dp", "--fault", "missing-tp-allreduce",
                 "--world-size", "4", "--html", str(page)]) == 0
    capsys.readouterr()
    html = page.read_text()
    # two charts, each mark with its label and its hover title
    assert html.count(">missing-tp-allreduce, divergent-parameters from step 1<") == 4
    assert ">divergent-parameters from step 1<" not in html
    reference = html[html.index("largest difference from the single-process run (log)"):]
    assert ">step 0<" in reference[:4000]
