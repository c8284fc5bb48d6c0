"""What ``distdoctor run`` (and ``analyze``) say about a user's script: cause first.

The findings of the checks are folded into causes of the kinds a user meets. A run that
hung or crashed has one of p2p-cycle, collective-mismatch, rank-exited-early, rank-crashed,
unused-params, busy-rank (a rank running its own code while its peers wait in a
collective for it) or hang-unknown: a mismatch outranks the crash it caused, and a rank's
own exception outranks the "Connection reset by peer" its peers raised after it. The bugs
that never crash follow, in the order they spoil training: non-finite, missing-tp-allreduce (a
tensor-parallel layer's ranks each go on with a partial sum), tp-batches-differ (they
compute on different batches), tp-dropout-rng (they drop different values of an
activation they must share), replicated-param-drift (copies of
a replicated parameter part), cleared-microbatches (a zero_grad() between the
micro-batches: each step applies its last alone), unsynced-microbatches (accumulation
whose last micro-batch ran inside no_sync(): the replicas apply different gradients),
rank-dependent-update (a
learning rate, clipping or optimiser state that differs by rank turns the same gradient
into different updates), divergent-parameters (the replicas are different models),
divergent-buffers (their running statistics differ), sum-without-mean (every step is
N times too large), duplicate-samples (the ranks train on the same data), then
repeated-epoch-order (each epoch replays the last), and last allreduce-every-microbatch
and tp-across-nodes (they cost time, not correctness). Each cause is chosen by the
``kind`` its finding carries (set by the check), never by the numbers inside it. Every
cause found is listed in ``findings``; ``cause`` is the first; evidence the ranks could
not record is listed in ``incomplete``. Written as JSON, the report has the schema
``distdoctor.run.v6`` (v5 named five kinds otherwise: gradient-not-averaged,
unused-parameters, sync-every-microbatch, tp-partial-sums, tp-replica-drift; v4 had no
``undecided``; v3 no ``also_at``; v2 no ``incomplete``; v1 had ``cause`` alone, without
``where``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from distdoctor.models import Call, CauseKind, Finding, RankRecord, RunRecord
from distdoctor.models.calls import (
    INIT_GROUP,
    describe_call,
    grouped,
    ranks_phrase,
    relative_line,
)
from distdoctor.models.jsoncodec import to_json
from distdoctor.models.record import (
    CRASHED,
    SIZE_MISMATCH,
    STOPPED,
    Frame,
    aborted_in_collective,
    is_peer_echo,
    is_size_mismatch,
    is_user_frame,
    seen_at_text,
    started_by,
    user_frame,
)
from distdoctor.userjob.reporting.stacktext import stack_text

RUN_SCHEMA = "distdoctor.run.v6"
# running: stopped while in its own code, in no traced call (a loop that never ends)
RankState = Literal["finished", "blocked", "running", "crashed", "exited"]


@dataclass(frozen=True)
class ReportCall:
    op: str
    peer: int | None
    seq: int
    shape: list[list[int]]
    dtype: str
    where: str
    reduce_op: str = ""  # SUM, MAX, ... for the reducing collectives


@dataclass(frozen=True)
class ReportSeen:
    """A line a running rank was seen at, in ``times`` of the ``of`` samples taken (the
    report's form of models.record.Seen: the place as one string)."""

    where: str
    times: int
    of: int


@dataclass(frozen=True)
class ReportRank:
    rank: int
    state: RankState
    call: ReportCall | None
    error: str | None
    stack: str
    running: str | None = None  # "function at file:line", for a rank stopped in no call
    collective: str | None = None  # the untraced collective it waits in, if torch knew one
    started_by: str | None = None  # "started by loss.backward() at train.py:31", with it
    seen: list[ReportSeen] = field(default_factory=list)  # a running rank's lines, sampled


@dataclass(frozen=True)
class Cause:
    kind: CauseKind
    ranks: list[int]
    summary: str
    fix: str
    where: str | None = None  # the script's line to change, when the evidence names one
    measured: dict = field(default_factory=dict)  # the detector's numbers, for the silent kinds
    # the other lines the cause involves, after ``where`` (the majority's call, where the
    # odd ranks out made another)
    also_at: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FixReport:
    """A patch ``run --fix`` made for some of the causes: verified by a re-run of the
    patched copy or not, what that re-run said, and the diff (empty unless verified: a
    patch that did not cure the run is never offered)."""

    cures: list[str]
    verified: bool
    rerun: str
    diff: str
    applied: str | None = None  # the original's backup, where --apply wrote the patch


@dataclass(frozen=True)
class ScriptReport:
    status: Literal["ok", "failed"]
    cause: Cause | None
    ranks: list[ReportRank]
    script: str
    wall_s: float
    findings: list[Cause] = field(default_factory=list)  # every cause found, ``cause`` first
    schema: str = RUN_SCHEMA
    # evidence the ranks could not record ("gradient samples on rank 1 from step 12
    # (RuntimeError: ...)"): the checks reading it may have missed something
    incomplete: list[str] = field(default_factory=list)
    # timing judgements whose interval straddles their limit ("straggler (rank 1): ..."):
    # neither a cause nor a clean bill, until more steps are measured
    undecided: list[str] = field(default_factory=list)
    fixes: list[FixReport] = field(default_factory=list)  # run --fix's patches

    def write(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(to_json(self), indent=1) + "\n")


def report(record: RunRecord, findings: tuple[Finding, ...], script: str,
           all_frames: bool = False) -> ScriptReport:
    """``all_frames``: each stopped rank's every frame and thread, not only the user's."""
    ended = classify(record, findings)
    causes = ([ended] if ended else []) + [c for c in silent_causes(findings)
                                           if ended is None or c.kind != ended.kind]
    ranks = [_rank(r, ended is not None, all_frames) for r in record.ranks]
    undecided = [f"{f.kind} ({ranks_phrase(f.ranks)}): {f.symptom}" for f in findings
                 if f.inconclusive and f.kind]
    built = ScriptReport("ok" if not causes else "failed", causes[0] if causes else None,
                         ranks, script, record.wall_s, causes, incomplete=incomplete(record),
                         undecided=undecided)
    if built.cause is None:
        return built
    # every line the text's "look at" names, carried by the cause itself: the JSON too
    places = look_at(built)
    cause = replace(built.cause, where=places[0] if places else None, also_at=places[1:])
    return replace(built, cause=cause, findings=[cause, *causes[1:]])


def incomplete(record: RunRecord) -> list[str]:
    """Each piece of evidence some ranks could not record, with the ranks, as a line."""
    ranks_of: dict[tuple, list[int]] = {}
    for rank in record.ranks:
        for gap in rank.evidence.incomplete:
            ranks_of.setdefault((gap.what, gap.step, gap.error), []).append(rank.rank)
    return [f"{what} on {ranks_phrase(ranks)}" + (f" from step {step}" if step is not None
                                                  else "") + (f" ({error})" if error else "")
            for (what, step, error), ranks in ranks_of.items()]


# the bugs that let a run finish, in the order they spoil training (a finding's ``kind``)
SILENT_ORDER: tuple[CauseKind, ...] = (
    "partial-step", "non-finite", "missing-tp-allreduce", "tp-batches-differ",
    "tp-dropout-rng", "replicated-param-drift", "cleared-microbatches",
    "unsynced-microbatches", "rank-dependent-update", "failed-sync", "divergent-parameters",
    "divergent-buffers", "sum-without-mean", "duplicate-samples", "repeated-epoch-order",
    "allreduce-every-microbatch", "tp-across-nodes", "over-memory-budget", "straggler",
    "unbalanced-stages")


def silent_causes(findings: tuple[Finding, ...]) -> list[Cause]:
    """The bugs that let the run finish, most fundamental first."""
    return [Cause(kind, list(f.ranks), f.symptom, f.fix,
                  relative_line(f.where[0]) if f.where else None, f.measured)
            for kind in SILENT_ORDER for f in findings
            if f.kind == kind and not f.inconclusive]


# the causes named before any rank exists (torchrun's nodes never met): no check sets
# them, the command's watcher and attach report them alone (cli/run.report_unformed)
BEFORE_ANY_RANK: tuple[CauseKind, ...] = ("rendezvous-mismatch", "rendezvous-incomplete")
# the causes of a run that stopped which a finding names outright, most specific first
NAMED_ORDER: tuple[CauseKind, ...] = (
    "world-size-mismatch", "duplicate-rank", "split-rendezvous", "backend-mismatch",
    "rank-never-joined",
    "unused-params", "collective-mismatch", "p2p-cycle", "group-cycle", "partial-step",
    "rank-exited-early",
    "busy-rank")


def classify(record: RunRecord, findings: tuple[Finding, ...]) -> Cause | None:
    for kind in NAMED_ORDER:
        named = next((f for f in findings if f.kind == kind), None)
        if named is not None:
            return _cause(kind, named)
    crashed = [r.end for r in record.ranks
               if r.end.status in CRASHED and not is_peer_echo(r.end)]
    if crashed:
        first = min(crashed, key=lambda e: e.at if e.at is not None else float("inf"))
        if is_size_mismatch(first):  # the traced calls did not show it: torch's own calls
            return Cause(
                "collective-mismatch", [first.rank],
                f"gloo ended rank {first.rank} in a collective whose size its peers did not "
                f"share ({SIZE_MISMATCH}): the ranks made different collectives, or the "
                f"same with other sizes, at one point of their group, in calls torch made "
                f"itself (DDP's, FSDP's, DTensor's), which the tracer does not see",
                "make every rank make the same collectives with the same sizes at the lines "
                "to look at; a collective on some ranks only (a metric, or full_tensor() to "
                "gather a sharded checkpoint on one rank) must run on every rank",
                # its whole faulthandler dump is on its stderr; the error keeps 60 lines
                raising_line(first.stderr) or raising_line(first.error))
        aborted = aborted_in_collective(first)
        if aborted is not None:  # the same, with the backend's message on another stream
            return Cause(
                "collective-mismatch", [first.rank],
                f"rank {first.rank} was aborted (SIGABRT) inside {aborted}, a collective "
                f"torch.distributed made for it: gloo aborts a rank so when the sizes its "
                f"peers sent did not match ({SIZE_MISMATCH}, on the launcher's stderr): the "
                f"ranks made different collectives, or the same with other sizes, at one "
                f"point of their group",
                "make every rank make the same collectives with the same sizes at the lines "
                "to look at; a collective on some ranks only (a metric, or full_tensor() to "
                "gather a sharded checkpoint on one rank) must run on every rank",
                raising_line(first.stderr))
        return Cause("rank-crashed", [first.rank],
                     f"rank {first.rank} {first.status} first: {first.headline}",
                     "fix the error in rank "
                     f"{first.rank}'s traceback; the other ranks' connection errors follow from it")
    if any(not r.end.ok for r in record.ranks):
        early = [r for r in record.ranks if r.end.ok]
        if early:
            return _exited_early(record, early)
    unknown = next((f for f in findings if f.kind == "hang-unknown"), None)
    return _cause("hang-unknown", unknown) if unknown is not None else None


def _cause(kind: CauseKind, found: Finding) -> Cause:
    return Cause(kind, list(found.ranks), found.symptom, found.fix,
                 found.where[0] if found.where else None, also_at=list(found.where[1:]))


def _calls_made(rank: RankRecord) -> str:
    """How many calls a rank made, as far as the trace can count them: its own calls, and
    DDP's (from C++, untraced) as the forwards that make them."""
    said = f"{len(rank.evidence.calls)} traced calls"
    forwards = len(rank.evidence.ddp_forwards)
    if forwards:
        said += f" and {forwards} DDP training forwards (DDP's own collectives, not traced)"
    return said


def _last_made(rank: RankRecord) -> tuple[str, str] | None:
    """A rank's last collective as far as the trace shows it (its last traced call, or,
    where DDP's own untraced ones came later, the training forward that made them), and
    where it was made."""
    calls, forwards = rank.evidence.calls, rank.evidence.ddp_forwards
    call = calls[-1] if calls else None
    forward = forwards[-1] if forwards else None
    if forward is not None and (call is None or forward.t is not None
                                and forward.t > call.entered):
        return (f"DDP's gradient all-reduce of its training forward #{len(forwards)} at "
                f"{relative_line(forward.where)}"), forward.where
    if call is not None:
        return call.describe(relative=True), call.where
    return None


def _exited_early(record: RunRecord, early: list[RankRecord]) -> Cause:
    """Peers failed only because ranks left: name who left, after how many calls, and
    where the others were waiting for them."""
    made = {r.rank: found for r in record.ranks if (found := _last_made(r)) is not None}
    left = "; ".join(grouped({r.rank: f"ended after {_calls_made(r)}" + (
        f" (last: {made[r.rank][0]})" if r.rank in made else "") for r in early}, " "))
    waiting = "; ".join(grouped({r.rank: made[r.rank][0] for r in record.ranks
                                 if not r.end.ok and r.rank in made}, " in "))
    # the line the others wait at (the call the early ranks never made) first, then where
    # the early ranks made their last call
    expected = [made[r.rank][1] for r in record.ranks if not r.end.ok and r.rank in made]
    last = [made[r.rank][1] for r in early if r.rank in made]
    lines = list(dict.fromkeys(expected + last))
    joining = [r for r in record.ranks if not r.end.ok and r.evidence.startup is not None
               and not r.evidence.startup.joined]
    if joining and len(joining) == sum(not r.end.ok for r in record.ranks):
        return _left_while_joining(early, joining, left)
    return Cause("rank-exited-early", [r.rank for r in early],
                 f"{left}, while the others still expected it"
                 + (f": {waiting}" if waiting else ""),
                 "make every rank make the same collective calls: the same number of steps "
                 "on every rank (pad or drop the last batches, or Join for DDP's uneven "
                 "inputs), and no rank returning early",
                 lines[0] if lines else None, also_at=lines[1:])


def _left_while_joining(early: list[RankRecord], joining: list[RankRecord],
                        left: str) -> Cause:
    """Ranks that left while their peers were still forming the group: torch's
    init_process_group returns on a rank once its own connections are made, not once
    every peer's are (no barrier unless TORCH_DIST_INIT_BARRIER=1), so a rank that makes
    no collective with its peers can leave, and close its side, while a slower peer is
    still connecting: gloo then fails that peer in connectFullMesh. Told from each rank's
    start-up record (joined or not), not from the peer's message."""
    starts = list(dict.fromkeys(r.evidence.startup.where for r in joining
                                if r.evidence.startup is not None))
    was = "was" if len(joining) == 1 else "were"
    return Cause(
        "rank-exited-early", [r.rank for r in early],
        f"{left}, while {ranks_phrase([r.rank for r in joining])} {was} still joining the "
        f"group (init_process_group at {', '.join(relative_line(w) for w in starts)}): "
        f"init_process_group returns on a rank before its peers have all connected (torch "
        f"makes no barrier there unless TORCH_DIST_INIT_BARRIER=1), so a rank that makes no "
        f"collective with them can leave first and break their connecting",
        "make every rank meet in one collective before any of them leaves (dist.barrier() "
        "before destroy_process_group, in a script that makes no collective of its own), "
        "or set TORCH_DIST_INIT_BARRIER=1 in the launcher's environment",
        starts[0] if starts else None, also_at=starts[1:])


def _rank(rank: RankRecord, failed: bool, all_frames: bool = False) -> ReportRank:
    end = rank.end
    calls = rank.evidence.calls
    blocking = [c for c in calls if c.blocking]
    call = blocking[-1] if blocking else (calls[-1] if calls else None)
    running = started = None
    joining = rank.evidence.startup is not None and not rank.evidence.startup.joined
    if end.status in STOPPED and joining:  # before any call: waiting for its group
        frame = user_frame(end.stacks)
        running = f"{frame.function} at {frame.place}" if frame else None
        started = started_by(frame) if frame else None
        return ReportRank(rank.rank, "blocked", None, None, stack_text(end.stacks, end.raw_stack,
                                                                   all_frames),
                          running, f"{INIT_GROUP} (waiting for its group to form)", started, [])
    if end.status in STOPPED and not blocking:
        # its last traced call completed: it is in its own code, or in a collective torch
        # made itself (DDP's), which the Flight Recorder saw
        state: RankState = "blocked" if end.collective else "running"
        frame = user_frame(end.stacks) if end.collective else end.running_at
        running = f"{frame.function} at {frame.place}" if frame else None
        started = started_by(frame) if frame and end.collective else None
    elif end.status in STOPPED:
        state = "blocked"
    elif end.status in CRASHED:
        state = "crashed"
    else:
        state = "exited" if failed else "finished"
    stack = stack_text(end.stacks, end.raw_stack, all_frames)
    error = end.error if end.status in CRASHED else None
    seen = [ReportSeen(s.frame.place, s.times, s.of) for s in end.seen] \
        if state == "running" and not end.collective else []
    return ReportRank(rank.rank, state, _call(call) if call else None, error, stack, running,
                      end.collective if running else None, started, seen)


def _call(call: Call) -> ReportCall:
    where = call.wait_where if call.async_op and call.wait_where else call.where
    return ReportCall(call.op, call.peer, call.seq, [list(s) for s in call.shapes], call.dtype,
                      where, call.reduce_op or "")


def raising_line(error: str | None) -> str | None:
    """file:line of the innermost frame of the user's own code in a traceback (innermost
    last) or a faulthandler dump ("most recent call first", as a rank that gloo aborted
    leaves): never distdoctor's, torch's, Python's or the environment's entry script."""
    import re

    frames = re.findall(r'File "([^"]+)", line (\d+)', error or "")
    user = [(f, n) for f, n in frames if is_user_frame(Frame(f, int(n), ""))]
    if not user:
        return None
    file, line = user[0] if "most recent call first" in (error or "") else user[-1]
    return f"{file}:{line}"


def _by_line(where: str) -> tuple[str, int]:
    path, _, line = where.rpartition(":")
    return (path, int(line)) if line.isdigit() else (where, 0)


def _section(r: ReportRank, cause: Cause | None) -> str:
    """What the report says of one rank after its number: its state, the call it was in,
    its last error line and its stack (identical sections are shown once for all)."""
    if r.collective:
        lines = [f"blocked; {r.collective}{', ' + r.started_by if r.started_by else ''}"
                 f"{'; last traced call: ' + call_text(r.call) if r.call else ''}"]
    elif r.state == "running":
        lines = [f"running, in no collective or send/receive: {r.running or 'no stack'}"
                 f"{seen_at_text(r.seen)}; last call: {call_text(r.call)}"]
    else:
        lines = [f"{r.state}; {'blocked in' if r.state == 'blocked' else 'last call'}: "
                 f"{call_text(r.call)}"]
    if r.error and (r.rank not in (cause.ranks if cause else [])
                    or cause is not None and error_line(r.error) not in cause.summary):
        lines.append("  " + error_line(r.error))  # (once: where the cause already says it)
    if r.stack and r.state in ("blocked", "running"):
        lines.append("  " + r.stack.replace("\n", "\n  "))
    return "\n".join(lines)


def error_line(error: str) -> str:
    """A rank's last error line as the report shows it: without gloo's advice ("This is
    typically caused by ..."), and with a peer's address and port as [peer], so the 31
    ranks that lost the same peer read as one."""
    import re

    line = error.strip().splitlines()[-1].split(" This is typically caused by")[0]
    return re.sub(r"\[[0-9A-Fa-f.:]+\]:\d+", "[peer]", line)[:300]


def call_text(call: ReportCall | None) -> str:
    if call is None:
        return "no traced call"
    return describe_call(call.op, call.peer, call.seq, call.shape, call.dtype,
                         call.reduce_op, where=call.where)


def look_at(result: ScriptReport) -> list[str]:
    """The user's lines the cause points at: the cause's own first, in its order (the odd
    ranks' call, then the majority's), then in file and line order where ranks wait, where
    the other findings point, where a running rank was, where the root cause raised."""
    places = {r.call.where for r in result.ranks  # (a rank in DDP's collective: its line)
              if r.call and r.state not in ("finished", "running") and not r.collective}
    places |= {c.where for c in result.findings if c.where}
    places |= {r.running.rsplit(" at ", 1)[1] for r in result.ranks if r.running}
    cause = result.cause
    if cause is not None and cause.kind in ("rank-crashed", "unused-params"):
        root = [r for r in result.ranks if r.rank in cause.ranks and r.error is not None]
        places |= {line for r in root[:1] for line in [raising_line(r.error)] if line}
    first = list(dict.fromkeys([cause.where, *cause.also_at])) \
        if cause is not None and cause.where else []
    named = {relative_line(p) for p in first}  # the same line, written either way
    return [p for p in first if p] + sorted(
        (p for p in places if p and relative_line(p) not in named), key=_by_line)


def render(result: ScriptReport, command: str = "run", partial: bool = False) -> str:
    """The human report: cause, ranks, lines and fix first, then each rank's state.
    ``partial``: some evidence could not be read (the verdict says so)."""
    lines = []
    based = " (from partial evidence)" if partial or result.incomplete else ""
    if result.cause is None:
        lines.append(f"distdoctor {command}: OK{based}: all {len(result.ranks)} ranks of "
                     f"{result.script} finished"
                     + (f" (the script ran {result.wall_s:.2f} s once every rank was up; "
                        f"starting them is not counted)" if result.wall_s else ""))
    else:
        cause = result.cause
        lines += [f"distdoctor {command}: FAILED{based}: {cause.kind}"
                  + (f" ({ranks_phrase(cause.ranks)})" if cause.ranks else " (before any rank)"),
                  f"  {cause.summary}", f"  fix: {cause.fix}"]
        for other in result.findings[1:]:
            lines += [f"also: {other.kind} ({ranks_phrase(other.ranks)})",
                      f"  {other.summary}", f"  fix: {other.fix}"]
        places = look_at(result)
        if places:
            lines.append("  look at: " + ", ".join(places))
    lines += [f"  evidence incomplete: {gap}" for gap in result.incomplete]
    lines += [f"  not decided: {text}" for text in result.undecided]
    if result.cause is not None:
        root = [r for r in result.ranks if r.rank in cause.ranks and r.error]
        if cause.kind in ("rank-crashed", "unused-params"):
            for r in root[:1]:
                lines.append(f"\nrank {r.rank} (root cause):\n" + (r.error or "").rstrip())
    sections: dict[str, list[int]] = {}  # ranks in the same state at the same lines: once
    for r in result.ranks:
        sections.setdefault(_section(r, result.cause), []).append(r.rank)
    lines += [f"\n{ranks_phrase(ranks)}: {text}" for text, ranks in sections.items()]
    aborted = [r.rank for r in result.ranks if r.error and "by signal SIGABRT" in r.error]
    if aborted:
        lines.append(f"\nnote: {ranks_phrase(aborted)} {'was' if len(aborted) == 1 else 'were'} "
                     f"aborted (SIGABRT: gloo and NCCL abort a process on a fatal error, such "
                     f"as a collective mismatch): the 'Fatal Python error: Aborted' and thread "
                     f"dump{'s' * (len(aborted) > 1)} on stderr are "
                     f"{'its' if len(aborted) == 1 else 'their'} last words, an effect of "
                     f"the cause above, not a second problem")
    return "\n".join(lines)
