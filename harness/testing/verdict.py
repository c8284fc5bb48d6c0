"""What a job on a test's ranks came to, in the words a failing test shows.

A rank whose own code raised is the headline, in pytest's format as that rank made it
(``onrank``); a rank that died is named with its exit; a hang is named by the same
analysis as ``distdoctor run`` (p2p cycle, collective mismatch, a rank that left early,
...). Every other rank follows in one line: finished, failed, or waiting in which call
at which line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from distdoctor.analysis.waitfor import PROVEN
from distdoctor.launch.results import JobResult
from distdoctor.models import RankEnd
from distdoctor.models.calls import clipped
from distdoctor.models.record import STOPPED, is_peer_echo, seen_at_text
from distdoctor.testing.onrank import EVENT
from distdoctor.userjob.reporting.record import explain, script_record
from distdoctor.userjob.reporting.report import (
    Cause,
    ReportRank,
    ScriptReport,
    call_text,
    error_line,
    look_at,
    ranks_phrase,
)

Status = Literal["passed", "failed", "skipped", "xfailed"]
# the analysis's causes that explain a failure beyond "a rank raised" or "a rank left"
MOST_CHARS = 200  # of a rank's exception line in a test's failure
_EXPLAINING = ("p2p-cycle", "group-cycle", "collective-mismatch", "unused-params")


class RankFailure(AssertionError):
    """A job did not succeed on every rank. ``kind``: "failed" (a rank's code raised),
    "died" (a rank's process ended without a result), or the hang analysis's cause
    ("p2p-cycle", "group-cycle", "collective-mismatch", "rank-exited-early", "unused-params",
    "busy-rank", "hang-unknown"); ``ranks``: the ranks it names; ``text``: the whole report."""

    def __init__(self, kind: str, ranks: tuple[int, ...], text: str):
        super().__init__(text)
        self.kind = kind
        self.ranks = ranks
        self.text = text


@dataclass(frozen=True)
class Outcome:
    status: Status
    kind: str | None  # see RankFailure
    ranks: tuple[int, ...]
    text: str  # the failure report, or the skip/xfail reason

    def failure(self) -> RankFailure:
        return RankFailure(self.kind or "failed", self.ranks, self.text)


def told(result: JobResult) -> dict[int, dict]:
    """Each rank's own account of how its code ended, where it sent one."""
    accounts = {}
    for rank, events in enumerate(result.events):
        for event in events:
            if isinstance(event, tuple) and len(event) == 2 and event[0] == EVENT:
                accounts[rank] = event[1]
    return accounts


def judge(result: JobResult, deadline: float, what: str) -> Outcome:
    """The verdict on one job: passed; skipped or xfailed (a rank said so, and none failed
    by itself); or failed, with the report. ``what`` names the code in the analysis."""
    if result.ok:
        return Outcome("passed", None, (), "")
    n = len(result.ends)
    accounts = told(result)
    raised = [e for e in result.ends if e.status == "raised"
              and accounts.get(e.rank, {}).get("outcome", "failed") == "failed"]
    own = [e for e in raised if not is_peer_echo(e)]
    died = [e for e in result.ends if e.status == "died"]
    if not own and not died:
        for status in ("skipped", "xfailed"):
            said = [r for r, a in sorted(accounts.items()) if a["outcome"] == status]
            if said:
                return Outcome(status, None, (said[0],),
                               f"rank {said[0]} of {n}: {accounts[said[0]]['text']}")
        if not any(e.status in STOPPED for e in result.ends):
            own = raised  # only peers' echoes are left: the first of them is the news
    report = explain(script_record(result.ends, result.traces, result.wall_s,
                                    result.started, deadline), what)
    cause = report.cause
    named: tuple[int, ...]
    if own or died:
        first = min(own + died, key=lambda e: e.at if e.at is not None else float("inf"))
        head, detail = _failed(first, accounts.get(first.rank), n)
        extra = _cause_block(report, cause) if cause and cause.kind in _EXPLAINING else []
        extra += detail
        kind = "failed" if first.status == "raised" else "died"
        named = (first.rank,)
    else:
        proven = any((e.error or "").startswith(PROVEN) for e in result.ends)
        how = "deadlock proven" if proven else _timed_out(result.ends)
        if cause is None:
            head, kind, named = f"{how}: no cause found", "hang-unknown", ()
        else:
            head = f"{how}: {cause.kind} ({ranks_phrase(cause.ranks)} of {n}): {cause.summary}"
            kind, named = cause.kind, tuple(cause.ranks)
        extra = _cause_block(report, cause, summary=False) if cause else []
    lines = [head, *extra]
    shown = set(named) if kind in ("failed", "died") else set()
    others = [r for r in report.ranks if r.rank not in shown]
    first_said = accounts.get(named[0], {}).get("headline") if shown else None
    if others:
        lines.append("ranks:" if not shown else "other ranks:")
        states: dict[str, list[int]] = {}  # ranks in the same state at the same line: once
        for r in others:
            state = _rank_state(r, result.ends[r.rank], accounts.get(r.rank), first_said)
            states.setdefault(state, []).append(r.rank)
        lines += [f"  {ranks_phrase(ranks)} of {n}: {state}" for state, ranks in states.items()]
    return Outcome("failed", kind, named, relative_paths("\n".join(lines)))


class StragglerWarning(UserWarning):
    """A test that passed, but whose ranks waited for one of them at every step."""


def stragglers(result: JobResult, deadline: float, what: str) -> list[str]:
    """The ranks a job's others waited for (the straggler check), each in a line; none for
    a job too short to have recorded when its ranks entered their collectives."""
    from distdoctor.analysis.stragglers import MIN_JOB_S

    if result.wall_s < MIN_JOB_S:
        return []
    report = explain(script_record(result.ends, result.traces, result.wall_s,
                                    result.started, deadline), what)
    return [relative_paths(f"{what}: {c.kind} ({ranks_phrase(c.ranks)} of "
                           f"{len(result.ends)}): {c.summary}")
            for c in report.findings if c.kind == "straggler"]


def relative_paths(text: str) -> str:
    """Paths as pytest shows them: relative to where it runs, where they lie below it."""
    return text.replace(os.getcwd().rstrip(os.sep) + os.sep, "")


def _short(headline: str) -> str:
    """An exception line without gloo's boilerplate advice, at most ``MOST_CHARS``."""
    headline = headline.split(" This is typically caused by")[0]
    return clipped(headline, MOST_CHARS)


def _failed(end: RankEnd, account: dict | None, n: int) -> tuple[str, list[str]]:
    """The first line naming the failed rank, and what it said (its traceback)."""
    if end.status == "died":
        return f"rank {end.rank} of {n} died: {end.error}", []
    if account is None:
        return f"rank {end.rank} of {n} failed: {_short(end.headline)}", ["", end.error or ""]
    return f"rank {end.rank} of {n}: {_short(account['headline'])}", \
        ["", account["text"].rstrip(), ""]


def _cause_block(report: ScriptReport, cause: Cause, summary: bool = True) -> list[str]:
    lines = [f"cause: {cause.kind} ({ranks_phrase(cause.ranks)}): {cause.summary}"] \
        if summary else []
    lines.append(f"  fix: {cause.fix}")
    places = look_at(report)
    if places:
        lines.append("  look at: " + ", ".join(places))
    return lines


def _timed_out(ends: tuple[RankEnd, ...]) -> str:
    reasons = [e.error for e in ends if e.status == "hung" and e.error]
    return f"timed out ({reasons[0]})" if reasons else "timed out"


def _rank_state(rank: ReportRank, end: RankEnd, account: dict | None,
                first_said: str | None = None) -> str:
    """What became of one rank, after its number: finished, failed, or waiting where."""
    if rank.state in ("finished", "exited"):
        return "finished"
    if rank.collective:
        return rank.collective + (f", {rank.started_by}" if rank.started_by else "")
    if rank.state == "blocked":
        return f"waiting in {call_text(rank.call)}"
    if rank.state == "running":
        where = f"running {rank.running}" if rank.running else "running (no stack)"
        where += seen_at_text(rank.seen)
        last = call_text(rank.call) if rank.call else "none"
        return f"{where}, in no collective (last call: {last})"
    if end.status == "died":
        return f"died: {end.error.splitlines()[0] if end.error else 'no reason'}"
    headline = _short(account["headline"] if account else end.headline)
    if account and account["headline"] == first_said:
        headline = "the same error"
    where = f" at {account['where']}" if account and account.get("where") else ""
    if rank.call is not None and is_peer_echo(end):
        where = f" in {call_text(rank.call)}"
        headline = error_line(headline)  # a peer's address differs on every rank
    return f"failed{where}: {headline}"


RankFailure.__module__ = "distdoctor.testing"  # where users import it from
