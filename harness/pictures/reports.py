"""The page each command writes with ``--html``: the verdict and findings as text first,
then the pictures that fit the run (a hang's wait-for graph and timeline, training curves,
memory, pipeline Gantt charts)."""

from __future__ import annotations

from html import escape

from distdoctor.models import RunRecord, RunReport
from distdoctor.models.calls import ranks_phrase
from distdoctor.pictures import arrivals, charts, gantt, page, timeline, waitgraph

GOOD = ("ok", "healthy", "fixed", "masked")


def script_page(record: RunRecord, result, command: str) -> str:
    """``distdoctor run`` / ``analyze``: ``result`` is the ScriptReport."""
    sections = [page.Section("Verdict", "findings", _script_findings(result))]
    sections += [s for s in (waitgraph.picture(record), timeline.picture(record),
                             arrivals.picture(record), charts.training(record))
                 if s is not None]
    states = page.table(["rank", "state", "call", "where"],
                        [[str(r.rank), r.state, r.call.op if r.call else "-",
                          (r.call.where if r.call else r.running) or "-"]
                         for r in result.ranks])
    sections.append(page.Section("Ranks", "ranks", states))
    return page.page(f"distdoctor {command}: {result.script}",
                     f"{len(record.ranks)} ranks; {_status(result)}", sections)


def _status(result) -> str:
    return "OK" if result.cause is None else f"FAILED: {result.cause.kind}"


def _script_findings(result) -> str:
    if result.cause is None:
        return page.verdict(f"OK: all {len(result.ranks)} ranks finished", "good")
    html = page.verdict(f"FAILED: {result.cause.kind} ({ranks_phrase(result.cause.ranks)})",
                        "bad")
    for cause in result.findings:
        html += page.finding(cause.kind, cause.summary, cause.fix,
                             f"look at: {cause.where}" if cause.where else "")
        for fix in getattr(result, "fixes", ()):  # run --fix: the patch beside the first
            if cause.kind == fix.cures[0]:  # cause it cures
                html += page.paragraph(
                    f"patch verified: the patched copy reports {fix.rerun}" if fix.verified
                    else f"a patch was tried and did not verify (the patched copy reports "
                         f"{fix.rerun}): none is offered", "note")
                html += page.diff(fix.diff) if fix.verified else ""
    return html


def diagnosis_page(report: RunReport, title: str) -> str:
    """``distdoctor diagnose`` and each case of ``demo``: before, the fix, after."""
    verdict = report.verdict
    tone = "good" if verdict.outcome in GOOD else "other" if \
        verdict.outcome == "inconclusive" else "bad"
    html = page.verdict(f"{verdict.outcome.upper()}: {verdict.note}".rstrip(": "), tone)
    for f in verdict.before.findings:
        html += page.finding(f.fault, f.symptom, f.fix,
                             "cause: " + f.cause + (" (inconclusive)" if f.inconclusive
                                                    else ""))
    if verdict.after is not None:
        after = verdict.after
        html += page.paragraph(
            "After the fix: " + ("no findings" if not after.findings else
                                 "; ".join(f.headline or f.fault for f in after.findings))
            + (f"; largest difference from the single-process run "
               f"{after.reference.max_abs_diff:.3g} (limit {after.reference.tolerance:g})"
               if after.reference else ""))
    sections = [page.Section("Verdict", "findings", html)]
    record = report.record
    reference = verdict.before.reference.per_step if verdict.before.reference else ()
    sections += [s for s in (waitgraph.picture(record), timeline.picture(record),
                             arrivals.picture(record),
                             charts.training(record, reference, verdict.before.findings),
                             charts.memory(record, record.spec.optimizer_name),
                             _pipeline(record)) if s is not None]
    return page.page(title, f"{record.spec.strategy} on {record.spec.world_size} "
                     f"{record.spec.backend} ranks", sections)


def _pipeline(record: RunRecord) -> page.Section | None:
    from distdoctor.pipeline.report import measured_bubble, simulated_for

    real = gantt.measured(record)
    if not real:
        return None
    html = real
    simulated = simulated_for(record) if record.finished else None  # whole steps only
    if simulated is not None:
        html += gantt.simulated(simulated[1])
    bubble = measured_bubble(record)
    if bubble is not None:
        html += page.paragraph(
            f"measured bubble {bubble:.1%}"
            + (f"; simulated for the same stages, micro-batches and costs "
               f"{simulated[1].bubble_fraction:.1%}" if simulated else ""), "note")
    return page.Section("Pipeline", "pipeline", html)


def simulate_page(timelines: list, table_text: str) -> str:
    """``pipeline simulate``: the table, then each schedule's chart."""
    html = f"<pre>{escape(table_text)}</pre>"
    span = max((t.makespan for t in timelines), default=None)  # one scale: lengths compare
    charts_html = "".join(gantt.simulated(t, span) for t in timelines)
    charts_html += page.paragraph("All charts share one time scale, so a shorter chart is a "
                                  "faster schedule.", "note")
    return page.page("distdoctor pipeline simulate", "schedules simulated from per-action "
                     "costs", [page.Section("Bubbles", "findings", html),
                               page.Section("Schedules", "pipeline", charts_html)])


def index_page(entries: list[tuple[str, str, str]]) -> str:
    """``demo --all``: (file, case, outcome) per page."""
    rows = "".join(f'<tr><td><a href="{escape(href)}">{escape(case)}</a></td>'
                   f"<td>{escape(outcome)}</td></tr>" for href, case, outcome in entries)
    html = f"<table><tr><th>case</th><th>verdict</th></tr>{rows}</table>"
    return page.page("distdoctor demo", f"{len(entries)} cases",
                     [page.Section("Cases", "findings", html)])
