"""``distdoctor analyze`` on traces as runs that went wrong leave them: cut mid-line, with
garbage, lines lost, files swapped or missing, two runs in one folder, and a rank SIGKILLed
while it traced under a real torchrun. Never a traceback; the cause named whenever the
calls that show it survive."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchrun_example import EXAMPLES, torchrun_example

from distdoctor.cli.main import main

pytestmark = pytest.mark.tier("e2e")

TRIED = {"damaged": 0}  # how many generated damages were analysed, for the closing note


@pytest.fixture(scope="module")
def hang_traces(tmp_path_factory) -> Path:
    """The traces of p2p_cycle.py (a send cycle) under a real torchrun, written once."""
    root = tmp_path_factory.mktemp("traces")
    torchrun_example(root / "hang", "p2p_cycle.py", 2, hangs=True)
    return root / "hang"


def analyze(capsys, directory: Path, *extra: str) -> tuple[int, str, str, dict | None]:
    report = directory.parent / f"{directory.name}.report.json"
    report.unlink(missing_ok=True)
    code = main(["analyze", str(directory), "--report", str(report), *extra])
    out, err = capsys.readouterr()
    return code, out, err, json.loads(report.read_text()) if report.exists() else None


def sends_intact(directory: Path) -> bool:
    """Both ranks' traces are there, as themselves, each with its blocked send whole."""
    for rank in (0, 1):
        path = directory / f"rank-{rank}.jsonl"
        if not path.exists():
            return False
        lines = path.read_bytes().split(b"\n")
        if not any(f'"rank":{rank}'.encode() in line and b'"op":"send"' in line
                   and line.endswith(b"}") and json_ok(line) for line in lines):
            return False
    return True


def json_ok(line: bytes) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def test_cutting_the_last_line_at_every_offset_never_breaks_analyze(capsys, hang_traces,
                                                                     tmp_path):
    last_line_start = hang_traces.joinpath("rank-1.jsonl").read_bytes().rstrip(b"\n") \
        .rfind(b"\n") + 1
    whole = hang_traces.joinpath("rank-1.jsonl").read_bytes()
    for offset in range(last_line_start, len(whole)):
        damaged = tmp_path / f"cut-{offset}"
        shutil.copytree(hang_traces, damaged)
        damaged.joinpath("rank-1.jsonl").write_bytes(whole[:offset])
        code, out, err, report = analyze(capsys, damaged)
        assert code == 1 and "Traceback" not in err + out, (offset, err)
        # the sends survive; on failure, what both traces held (seen once under -n 2 at a
        # load of 14, not reproduced in 8 runs under a CPU hog: kept to find out why)
        assert report["cause"]["kind"] == "p2p-cycle", (
            offset, out, whole.decode(errors="replace"),
            hang_traces.joinpath("rank-0.jsonl").read_text(errors="replace"))


def test_a_line_of_garbage_is_named_and_skipped(capsys, hang_traces, tmp_path):
    damaged = tmp_path / "garbage"
    shutil.copytree(hang_traces, damaged)
    whole = damaged.joinpath("rank-0.jsonl").read_bytes().count(b"\n")
    with damaged.joinpath("rank-0.jsonl").open("ab") as trace:
        trace.write(b'{"ev":"done","id":\xff\xfe\\uZZZZ\n{"ev":"enter","t":"soon"}\n')
    code, out, err, report = analyze(capsys, damaged)
    assert code == 1 and report["cause"]["kind"] == "p2p-cycle"
    assert f"distdoctor analyze: partial evidence: {damaged}/rank-0.jsonl: lines " \
           f"{whole + 1}, {whole + 2} could not be read, skipped" in out
    assert "distdoctor analyze: FAILED (from partial evidence): p2p-cycle" in out


def test_a_rank_with_no_trace_is_named_and_blamed(capsys, hang_traces, tmp_path):
    damaged = tmp_path / "lost"
    shutil.copytree(hang_traces, damaged)
    damaged.joinpath("rank-1.jsonl").unlink()
    code, out, err, report = analyze(capsys, damaged)
    assert code == 1 and "Traceback" not in err
    assert "rank 1: no trace: its node may have died before it wrote" in out
    assert 1 in report["cause"]["ranks"]


def test_dumps_that_hold_nothing_are_not_called_ok(capsys, hang_traces, tmp_path):
    """Every trace gone, only the ranks' Flight Recorder dumps left: gloo's recorder holds
    no sends or receives, so a send cycle's dumps hold no operations. They say nothing of
    how the job went: one line and exit 2, never "OK: all ranks finished"."""
    left = tmp_path / "dumps-only"
    shutil.copytree(hang_traces, left)
    for trace in left.glob("rank-*.jsonl"):
        trace.unlink()
    assert sorted(p.name for p in left.glob("frdump_rank_*")) == ["frdump_rank_0",
                                                                  "frdump_rank_1"]
    code, out, err, report = analyze(capsys, left)
    assert (code, report) == (2, None) and err.count("\n") == 1, (out, err)
    assert "hold no operations, so they say nothing of how the job went" in err
    assert "OK" not in out


def test_two_runs_in_one_folder_are_never_mixed(capsys, hang_traces, tmp_path):
    mixed = tmp_path / "mixed"
    shutil.copytree(hang_traces, mixed)
    other = mixed / "rank-1.jsonl"
    first = json.loads(other.read_text().splitlines()[0])
    other.write_text(other.read_text().replace(first["run"], "an-earlier-run"))
    code, out, err, _ = analyze(capsys, mixed)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"these traces are of 2 runs, not one: run {first['run']}: rank-0.jsonl; " \
           f"run an-earlier-run: rank-1.jsonl; pick one with --run ID" in err
    code, out, err, report = analyze(capsys, mixed, "--run", first["run"])
    assert code == 1 and "rank 1: no trace" in out  # that run's rank 1 is not in the folder


DAMAGE = st.lists(st.tuples(st.sampled_from(["cut", "garbage", "delete", "replace", "swap",
                                              "remove"]),
                            st.sampled_from([0, 1]), st.integers(0, 10**6),
                            st.binary(max_size=40)), min_size=1, max_size=3)


# capsys is read (and so reset) by every analyze(); tmp_path_factory gives each its folder
@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damage=DAMAGE)
def test_any_damage_to_real_traces_gives_a_diagnosis_or_one_line_never_a_traceback(
        capsys, hang_traces, tmp_path_factory, damage):
    directory = tmp_path_factory.mktemp("damaged") / "traces"
    shutil.copytree(hang_traces, directory)
    for kind, rank, at, noise in damage:
        path = directory / f"rank-{rank}.jsonl"
        if not path.exists():
            continue
        lines = path.read_bytes().split(b"\n")
        if kind == "cut":
            data = path.read_bytes()
            path.write_bytes(data[:at % (len(data) + 1)])
        elif kind == "garbage":
            lines.insert(at % (len(lines) + 1), noise)
            path.write_bytes(b"\n".join(lines))
        elif kind == "delete":
            del lines[at % len(lines)]
            path.write_bytes(b"\n".join(lines))
        elif kind == "replace":
            lines[at % len(lines)] = noise
            path.write_bytes(b"\n".join(lines))
        elif kind == "swap":
            other = directory / f"rank-{1 - rank}.jsonl"
            if other.exists():
                swapped = path.read_bytes()
                path.write_bytes(other.read_bytes())
                other.write_bytes(swapped)
        else:
            path.unlink()
    intact = sends_intact(directory) and not any(kind == "swap" for kind, *_ in damage)
    code, out, err, report = analyze(capsys, directory)
    TRIED["damaged"] += 1
    assert "Traceback" not in err + out
    assert code in (1, 2)
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("distdoctor analyze: error: ")
    if intact:
        assert report["cause"]["kind"] == "p2p-cycle", (
            damage, out, *(p.read_text(errors="replace") for p in sorted(
                directory.glob("rank-*.jsonl"))))


def test_the_damage_search_tried_what_it_says(request):
    """Run after the search: how many damaged trace folders it analysed (the note quotes
    it). Alone, the search did not run: nothing to count."""
    if TRIED["damaged"] == 0:
        pytest.skip("the damage search did not run in this session")
    print(f"\nanalysed {TRIED['damaged']} damaged trace folders, none with a traceback")
    assert TRIED["damaged"] >= 100


SPAMMER = """import os, signal
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(64)
for step in range(100000):
    dist.all_reduce(t)  # LINE all_reduce
    if rank == 1 and step == 3000:
        os.kill(os.getpid(), signal.SIGKILL)  # OOM-killed, as far as anyone can tell
"""


def test_a_rank_sigkilled_while_tracing_heavily_under_torchrun(capsys, tmp_path):
    script = EXAMPLES / "spam_then_die.py"
    try:
        script.write_text(SPAMMER)
        torchrun_example(tmp_path / "killed", script.name, 2)
    finally:
        script.unlink(missing_ok=True)
    code, out, err, report = analyze(capsys, tmp_path / "killed")
    assert code == 1 and "Traceback" not in err
    assert (report["cause"]["kind"], report["cause"]["ranks"]) == ("rank-crashed", [1]), out
    assert "rank 1 died first: its trace stops mid-run with no exit, no stall and no " \
           "stacks: it was killed" in out


def test_a_rank_that_noted_a_stall_then_went_on_and_aborted_is_judged_by_its_abort(tmp_path):
    """Slow at one line on a loaded machine (a mesh forming), a rank notes a stall and
    dumps its stacks, then goes on and is aborted by gloo in a later collective: its end
    is the abort, read from the fatal signal's stacks (the second dump in its file), not
    a hang at the slow line."""
    from distdoctor.models.events import Ev
    from distdoctor.userjob.reporting.traces import load

    call = {"ev": Ev.ENTER, "id": 1, "t": 2.0, "op": "all_reduce", "seq": 0,
            "group": [0, 1], "peer": None, "peers": [], "shapes": [[4]], "dtype": "float32",
            "reduce_op": "SUM", "where": "train.py:20", "rank": 0, "async_op": False}
    events = [{"ev": Ev.START, "t": 0.0, "run": "r", "world": 1},
              {"ev": Ev.STALLED, "t": 1.0}, call, {"ev": Ev.DONE, "id": 1, "t": 2.1}]
    (tmp_path / "rank-0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (tmp_path / "rank-0.stacks").write_text(
        'Thread 0x01 (most recent call first):\n  File "train.py", line 11 in <module>\n\n'
        'Fatal Python error: Aborted\n\n'
        'Thread 0x01 (most recent call first):\n  File "train.py", line 22 in <module>\n')
    end = load([str(tmp_path)]).ends[0]
    assert (end.status, end.exitcode) == ("died", -6), end
    assert "line 22" in (end.raw_stack or "") and "line 11" not in (end.raw_stack or "")


def test_a_rank_stopped_while_raising_from_a_peers_exit_waited_like_the_others(capsys,
                                                                              hang_traces,
                                                                              tmp_path):
    """Seen under --exit-on-hang: rank 1's watch decided its stall while its send was open,
    sampled where it was for 60 ms, and meanwhile rank 0 exited and the send failed; the
    stall was written after the failure (its time before it), and torchrun's SIGTERM came
    while the script was formatting its traceback, before any exit or stall stacks were
    written. Its call failed only because its peer was gone: it waited like rank 0, and the
    cycle stands (it was read as hang-unknown)."""
    raced = tmp_path / "raced"
    shutil.copytree(hang_traces, raced)
    trace = raced / "rank-1.jsonl"
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    send = next(e for e in events if e["ev"] == "enter" and e["op"] == "send")
    stall = next(e for e in events if e["ev"] == "stalled")
    kept = events[:events.index(send) + 1]
    failure = "RuntimeError('[pair.cc:553] Connection closed by peer [127.0.0.1]:13738.')"
    kept += [{"ev": "error", "id": send["id"], "t": stall["t"] + 0.06, "error": failure},
             stall]  # written last, timed first
    trace.write_text("".join(json.dumps(e) + "\n" for e in kept))
    (raced / "rank-1.stacks").write_text(
        "Current thread 0x00007fc2a47c4b80 (most recent call first):\n"
        '  File "/usr/lib/python3.11/traceback.py", line 139 in format_exception\n'
        '  File "/site/distdoctor/userjob/inrank/bootstrap.py", line 240 in _run_script\n')
    code, out, err, report = analyze(capsys, raced)
    assert code == 1 and (report["cause"]["kind"], report["cause"]["ranks"]) == (
        "p2p-cycle", [0, 1]), out
