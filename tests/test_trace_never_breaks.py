"""The tracer never breaks the user's job: a trace that cannot be written, or a hook that
fails, costs the trace, said once on stderr; the job's output and exit code stay its own."""

from __future__ import annotations

import os
import subprocess
import sys

import jobs
import pytest

pytestmark = pytest.mark.tier("warm")

SCRIPT = """import sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
t = torch.ones(2)
for _ in range(3):
    dist.all_reduce(t)
print("trained", t.tolist(), flush=True)
sys.exit(3)
"""


def traced(tmp_path, trace_dir: str) -> subprocess.CompletedProcess:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(port=port))
    return subprocess.run([sys.executable, "-m", "distdoctor.userjob", "--trace-dir", trace_dir,
                           str(script)], env=dict(os.environ, RANK="0", WORLD_SIZE="1"),
                          capture_output=True, text=True, timeout=120)


def test_a_trace_file_that_refuses_writes_costs_the_trace_not_the_job(tmp_path):
    trace_dir = tmp_path / "traces"
    trace_dir.mkdir()
    (trace_dir / "rank-0.jsonl").symlink_to("/dev/full")  # every write: ENOSPC
    done = traced(tmp_path, str(trace_dir))
    assert (done.returncode, done.stdout) == (3, "trained [1.0, 1.0]\n")
    assert done.stderr == "distdoctor: cannot write the trace (No space left on device); " \
                          "the job goes on, untraced\n"


def test_a_trace_directory_that_cannot_be_made_costs_the_trace_not_the_job(tmp_path):
    (tmp_path / "a-file").write_text("")
    done = traced(tmp_path, str(tmp_path / "a-file" / "traces"))
    assert (done.returncode, done.stdout) == (3, "trained [1.0, 1.0]\n")
    assert done.stderr == f"distdoctor: cannot write traces to {tmp_path}/a-file/traces " \
                          f"(Not a directory); the job goes on, untraced\n"


def test_a_failing_hook_lets_the_collective_through_and_says_so_once(pools):
    result = pools(2).run(jobs.all_reduce_with_a_broken_tracer, deadline=60)
    assert result.raise_for_status().values == (4.0, 4.0)
    for end in result.ends:
        assert end.stderr.count("distdoctor: cannot record all_reduce calls "
                                "(ZeroDivisionError: the tracer's own bug)") == 1


def test_a_loader_whose_samples_are_not_numbers_loads_on_untraced():
    from distdoctor.launch.pool import shared_pool

    result = shared_pool(2, evidence=True).run(jobs.loader_of_named_samples, deadline=60)
    assert result.raise_for_status().values == ([[1.0, 2.0], [3.0, 4.0]],) * 2
    for end in result.ends:
        assert end.stderr.count("distdoctor: cannot record the batches a loader drew "
                                "(ValueError") == 1
