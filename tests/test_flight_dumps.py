"""``distdoctor analyze`` on torch's Flight Recorder dumps alone, no trace of ours.

Real dumps: jobs run here with no launcher of ours and nothing of distdoctor in their
ranks (tests/launched/fr_dumps.py), each rank writing torch's own dump
(``_dump_fr_trace``) when it has waited in an operation for a second, or as its script
ends. Synthetic dumps (bench/frdumps.py) for what gloo cannot produce: nccl's states and
point-to-point records, coalesced operations, subgroups at 16 ranks, every schema version,
JSON. Each verdict is checked against the line the script marks and the rank the
generator made the culprit, and healthy look-alikes must stay quiet.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
CASES = Path(__file__).parent / "launched" / "frcases"
RUNNER = Path(__file__).parent / "launched" / "fr_dumps.py"
sys.path.insert(0, str(ROOT / "bench"))
import frdumps  # noqa: E402 (bench/ is not a package: its path is set above)
from lanes import Job, Step  # noqa: E402 (tests/ modules, beside the path set-up above)
from sources import line_of  # noqa: E402 (kept beside it: the one path set-up above)

pytestmark = pytest.mark.tier("e2e")

# name -> (script, world, dumps the job leaves, dumped as its script ends)
REAL = {
    "collective_on_one_rank": (EXAMPLES / "rank_zero_metric.py", 2, 2, False),
    "collective_on_one_rank_json": (EXAMPLES / "rank_zero_metric.py", 2, 2, False),
    "mismatched_sizes": (CASES / "broadcast_sizes.py", 3, 3, True),
    "rank_that_exited": (CASES / "rank_leaves.py", 3, 2, False),
    "ddp_forward_on_one_rank": (EXAMPLES / "eval_on_rank0_through_ddp.py", 2, 2, False),
    "fsdp_gather_on_one_rank": (CASES / "fsdp_gather_on_rank0.py", 2, 2, False),
    "healthy_eval_through_module": (EXAMPLES / "healthy" / "eval_on_rank0_module.py", 2, 2,
                                    True),
    "healthy_fsdp_checkpoint": (EXAMPLES / "healthy" / "fsdp_checkpoint_every_rank.py", 2, 2,
                                True),
    "healthy_two_groups": (EXAMPLES / "healthy" / "two_groups_mesh.py", 4, 4, True),
}
# name -> (cause kind, culprit ranks, text of the line named first)
EXPECTED = {
    "collective_on_one_rank": ("collective-mismatch", [0], "# BUG"),
    "collective_on_one_rank_json": ("collective-mismatch", [0], "# BUG"),  # as JSON
    "mismatched_sizes": ("collective-mismatch", [0], "dist.broadcast"),
    "rank_that_exited": ("rank-exited-early", [1], "dist.all_reduce"),
    "ddp_forward_on_one_rank": ("collective-mismatch", [0], "# BUG"),
    "fsdp_gather_on_one_rank": ("collective-mismatch", [0], "# BUG"),
}


def lane_jobs(root: Path) -> list[Job]:
    """Every real job, as background jobs (tests/lanes.py): each is a few interpreters
    importing torch, and no time is judged."""
    jobs = []
    for name, (script, world, dumps, at_exit) in REAL.items():
        out = root / name
        out.mkdir()
        env = {"FR_DUMP_AT_EXIT": "1" if at_exit else "0",
               "FR_DUMP_JSON": "1" if name.endswith("_json") else "0"}
        jobs.append(Job(f"flight recorder {name}", (Step(
            "job", (sys.executable, str(RUNNER), str(out), str(world), str(script),
                    str(dumps)), str(root), env, timeout=120),)))
    return jobs


@pytest.fixture(scope="module")
def real_dumps(lanes) -> dict[str, Path]:
    """Every real job's dumps folder; the job's output is kept beside it (job.log)."""
    found = {}
    for name in REAL:
        job = f"flight recorder {name}"
        done = lanes.result(job)["job"]
        out = Path(lanes.job(job).steps[0].argv[2])
        (out.parent / f"{name}.log").write_text(done.stdout + done.stderr)
        found[name] = out
    return found


def job_log(out: Path) -> str:
    return (out.parent / f"{out.name}.log").read_text(errors="replace")[-3000:]


def analyze(distdoctor, tmp_path, *args: str):
    report = tmp_path / "report.json"
    done = distdoctor("analyze", *args, "--report", str(report))
    return done, json.loads(report.read_text()) if report.exists() else None


@pytest.mark.timeout(900)  # the first test waits for every job (module fixture)
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_hung_jobs_real_dumps_name_the_cause_rank_and_line(name, real_dumps, distdoctor,
                                                             tmp_path):
    kind, ranks, marked = EXPECTED[name]
    script, world, dumps, _ = REAL[name]
    assert len(list(real_dumps[name].iterdir())) == dumps, job_log(real_dumps[name])
    done, report = analyze(distdoctor, tmp_path, str(real_dumps[name]))
    assert done.returncode == 1, done.stdout + done.stderr + job_log(real_dumps[name])
    assert f"{dumps} Flight Recorder dumps of {world} ranks" in done.stdout
    cause = report["cause"]
    assert (cause["kind"], cause["ranks"]) == (kind, ranks), done.stdout + job_log(
        real_dumps[name])
    if name.endswith("_json"):  # torch's JSON dumps hold no Python frames: no lines
        assert cause["where"] is None and "holds no Python frames" in done.stdout
    else:
        assert cause["where"].endswith(line_of(script, marked, base=script.parent)), done.stdout


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(set(REAL) - set(EXPECTED)))
def test_a_healthy_jobs_real_dumps_stay_quiet(name, real_dumps, distdoctor, tmp_path):
    done, report = analyze(distdoctor, tmp_path, str(real_dumps[name]))
    assert done.returncode == 0, done.stdout + done.stderr + job_log(real_dumps[name])
    assert report["status"] == "ok"
    assert "holds no operations" not in done.stdout  # the recorder held the job's calls


@pytest.mark.timeout(300)
def test_the_dumps_of_one_job_spread_over_two_nodes_folders_are_read_as_one(
        real_dumps, distdoctor, tmp_path):
    first, second = tmp_path / "node0", tmp_path / "node1"
    for folder, rank in ((first, 0), (second, 1)):
        folder.mkdir()
        shutil.copy(real_dumps["collective_on_one_rank"] / f"nccl_trace_rank_{rank}", folder)
    done, report = analyze(distdoctor, tmp_path, str(first), str(second))
    assert (report["cause"]["kind"], report["cause"]["ranks"]) == ("collective-mismatch", [0])


# -- synthetic nccl-shaped dumps -------------------------------------------------------------

SYNTHETIC = {  # case -> (kind, culprits, the user's line named first)
    "extra": ("collective-mismatch", [5], f"train.py:{frdumps.LINES['extra']}"),
    "size": ("collective-mismatch", [5], f"train.py:{frdumps.LINES['grad']}"),
    "behind": ("collective-mismatch", [5], f"train.py:{frdumps.LINES['grad']}"),
    "coalesced": ("collective-mismatch", [5], f"train.py:{frdumps.LINES['coalesced']}"),
    "p2p": ("p2p-cycle", [5, 6], None),
}


def synthetic(tmp_path: Path, case: str, world: int = 16, version: str = "2.10",
              as_json: bool = False, entries: int = 300) -> Path:
    out = tmp_path / f"{case}-{version}{'-json' * as_json}"
    frdumps.write(frdumps.Job(world, 4, entries, case, 5, version), str(out), as_json=as_json)
    return out


@pytest.mark.parametrize("case", sorted(SYNTHETIC))
def test_an_nccl_jobs_dumps_name_the_culprit(case, distdoctor, tmp_path):
    kind, culprits, line = SYNTHETIC[case]
    done, report = analyze(distdoctor, tmp_path, str(synthetic(tmp_path, case)))
    assert done.returncode == 1, done.stdout + done.stderr
    assert (report["cause"]["kind"], report["cause"]["ranks"]) == (kind, culprits), \
        done.stdout
    if line:
        assert report["cause"]["where"].endswith(line), done.stdout
    assert "ring buffer wrapped" in done.stdout  # 300 kept of more made


def test_the_culprit_in_an_nccl_job_that_ran_its_own_collective_is_named_with_the_others(
        distdoctor, tmp_path):
    done, _ = analyze(distdoctor, tmp_path, str(synthetic(tmp_path, "extra")))
    assert "rank 5 waits in all_reduce (#" in done.stdout
    assert "a call ranks 1, 9, 13 never made there" in done.stdout


def test_a_rank_stuck_in_its_own_code_is_the_one_its_group_waits_for(distdoctor, tmp_path):
    done, _ = analyze(distdoctor, tmp_path, str(synthetic(tmp_path, "behind")))
    assert "for rank 5, which never joined it (rank 5: every operation its Flight " \
           "Recorder holds completed" in done.stdout


def test_a_healthy_nccl_jobs_dumps_stay_quiet(distdoctor, tmp_path):
    done, report = analyze(distdoctor, tmp_path, str(synthetic(tmp_path, "healthy")))
    assert done.returncode == 0, done.stdout
    assert report["status"] == "ok"


def test_a_job_caught_inside_a_collective_every_rank_joined_is_not_a_hang(distdoctor,
                                                                           tmp_path):
    """Dumped on demand while every rank is inside the same all-reduce: nobody waits for
    anybody the dumps can name; said as a note, not a failure."""
    out = synthetic(tmp_path, "healthy", world=8)
    for path in out.iterdir():
        dump = pickle.loads(path.read_bytes())  # our own file, written just above
        last = dump["entries"][-1]
        last.update(state="started", retired=False, time_discovered_completed_ns=None)
        del last["duration_ms"]
        status = dump["pg_status"][str(last["pg_id"])]
        status["last_completed_collective"] = last["op_id"] - 1
        path.write_bytes(pickle.dumps(dump, protocol=2))
    done, report = analyze(distdoctor, tmp_path, str(out))
    assert done.returncode == 0, done.stdout
    assert "every member of its group had joined it" in done.stdout


@pytest.mark.parametrize("version", frdumps.VERSIONS)
def test_every_schema_version_is_read(version, distdoctor, tmp_path):
    done, report = analyze(distdoctor, tmp_path, str(synthetic(tmp_path, "size",
                                                                  version=version)))
    assert f"(schema {version}, nccl)" in done.stdout
    assert (report["cause"]["kind"], report["cause"]["ranks"]) == ("collective-mismatch", [5])


@pytest.mark.parametrize("version", ["2.3", "2.10"])
def test_json_dumps_read_as_the_pickles(version, distdoctor, tmp_path):
    done, report = analyze(distdoctor, tmp_path, str(synthetic(
        tmp_path, "extra", version=version, as_json=True)))
    assert (report["cause"]["kind"], report["cause"]["ranks"]) == ("collective-mismatch", [5])


def test_missing_and_truncated_dumps_are_said_and_the_culprit_still_named(distdoctor,
                                                                            tmp_path):
    out = synthetic(tmp_path, "extra")
    (out / "nccl_trace_rank_14").unlink()
    cut = out / "nccl_trace_rank_15"
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    done, report = analyze(distdoctor, tmp_path, str(out))
    assert "partial evidence: " in done.stdout and "cut short" in done.stdout
    assert "ranks 14, 15: no Flight Recorder dump" in done.stdout
    assert "FAILED (from partial evidence)" in done.stdout
    assert (report["cause"]["kind"], report["cause"]["ranks"]) == ("collective-mismatch", [5])


def test_gloo_dumps_say_they_hold_no_sends_or_receives(real_dumps, distdoctor, tmp_path):
    done, _ = analyze(distdoctor, tmp_path, str(real_dumps["collective_on_one_rank"]))
    assert "gloo's recorder holds no sends or receives" in done.stdout


def test_thousands_of_files_are_read_on_every_core_with_the_same_verdict(distdoctor,
                                                                          tmp_path):
    from distdoctor.dumps.collect import PARALLEL_FROM

    world = PARALLEL_FROM + 16
    out = tmp_path / "many"
    frdumps.write(frdumps.Job(world, 4, 40, "extra", 133, steps=12), str(out))
    done, report = analyze(distdoctor, tmp_path, str(out))
    assert (report["cause"]["kind"], report["cause"]["ranks"]) == ("collective-mismatch",
                                                                   [133])
    assert f"read {world} of {world} dumps" in done.stderr  # progress, on every core


def test_a_prefix_picks_the_dumps_by_name(distdoctor, tmp_path):
    out = synthetic(tmp_path, "extra", world=8)
    done, report = analyze(distdoctor, tmp_path, str(out), "--prefix", "nccl_trace_rank_")
    assert report["cause"]["ranks"] == [5]
    done = distdoctor("analyze", str(out), "--prefix", "other_rank_")
    assert done.returncode == 2
    assert "no Flight Recorder dumps in" in done.stderr and "named other_rank_<rank>" \
        in done.stderr


# -- untrusted files ----------------------------------------------------------------------------


class _RunsCode:
    """Pickles as a call of os.system: what a hostile dump can hold."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_dump_that_would_run_code_is_refused_and_nothing_runs(distdoctor, tmp_path):
    out = synthetic(tmp_path, "extra", world=4)
    marker = tmp_path / "ran"
    dump = pickle.loads((out / "nccl_trace_rank_2").read_bytes())
    dump["entries"][0]["frames"] = [_RunsCode(marker)]
    (out / "nccl_trace_rank_2").write_bytes(pickle.dumps(dump, protocol=2))
    done = distdoctor("analyze", str(out))
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "nccl_trace_rank_2" in lines[0] and "posix.system" in lines[0]
    assert "nothing of it was run" in lines[0] and "Traceback" not in done.stderr
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"", b"\x80\x02}q\x00(X\x07\x00\x00\x00version", b"{\"ve",
                                     b"\x80\x02]q\x00.", b"{\"version\": \"2.10\"}"])
def test_files_that_are_not_dumps_are_skipped_with_a_word(content, distdoctor, tmp_path):
    out = synthetic(tmp_path, "extra", world=4)
    (out / "nccl_trace_rank_3").write_bytes(content)
    done = distdoctor("analyze", str(out))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert "rank 3: no Flight Recorder dump" in done.stdout


def test_bad_directories_get_one_line_and_exit_2(distdoctor, tmp_path):
    done = distdoctor("analyze", str(tmp_path / "nowhere"))
    assert done.returncode == 2 and "is not a directory" in done.stderr
    (tmp_path / "notes.txt").write_text("hello")
    done = distdoctor("analyze", str(tmp_path))
    assert done.returncode == 2
    assert "no rank-*.jsonl traces and no Flight Recorder dumps" in done.stderr


def test_the_report_json_and_html_are_written_from_dumps(distdoctor, tmp_path):
    page = tmp_path / "report.html"
    done, report = analyze(distdoctor, tmp_path, str(synthetic(tmp_path, "p2p", world=8)),
                           "--html", str(page))
    assert report["cause"]["kind"] == "p2p-cycle"
    assert "<svg" in page.read_text()
