"""Under distdoctor a program does exactly what it does under torchrun: the transparency
corpus (``examples/transparency/``), one script per torch distributed feature a user may
reach for, each printing a digest of what it ended with (its parameters, its results).
Each runs under plain torchrun (the reference), under ``distdoctor run SCRIPT``, under
``distdoctor run -- torchrun ...`` and under torchrun with the in-rank bootstrap followed
by ``distdoctor analyze``: the same exit code, the same digest lines, and an OK verdict.
DDP under ``Join`` once crashed under the tracer (a stand-in for torch's Work reached
C++); post-local SGD and a world all-reduce's subgroups were called divergent."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.tier("e2e")

CORPUS_DIR = Path(__file__).resolve().parent.parent / "examples" / "transparency"
# (script, ranks): 4 where the feature needs two subgroups of two
CORPUS = [("join_ddp.py", 2), ("join_zero.py", 2), ("comm_hooks.py", 2),
          ("post_local_sgd.py", 4), ("async_ops.py", 2), ("batch_p2p.py", 2),
          ("all_to_all_uneven.py", 2), ("object_collectives.py", 2),
          ("monitored_barrier.py", 2), ("subgroups.py", 4), ("dtensor_mesh.py", 2),
          ("fsdp2.py", 2), ("pipelining.py", 2), ("dcp_save_load.py", 2),
          ("ddp_static_bucket_view.py", 2)]
# torch's own gloo aborts at a process's teardown now and then, with no distdoctor in it:
# plain torchrun on join_ddp.py ended so in 1 of 12 runs here. A form that ends so is run
# again (up to TEARDOWN_TRIES times in all), and the retries are counted: a distdoctor that
# made the abort common (its sampler thread once did, in 3 of 8 runs) still fails.
TEARDOWN_ABORT = "terminate called without an active exception"
TEARDOWN_TRIES = 3
TEARDOWN_RETRIES: list[tuple[str, str]] = []
MOST_RETRIES = 5  # in 60 runs; at torch's own rate about 0.6 are expected
DIGEST = re.compile(r"^[a-z0-9-]+ rank \d+: -?\d+\.\d{6}$", re.MULTILINE)
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


def test_every_transparency_script_is_in_the_corpus():
    scripts = {p.name for p in CORPUS_DIR.glob("*.py") if not p.name.startswith("_")}
    assert scripts == {script for script, _ in CORPUS}


def _digests(text: str) -> list[str]:
    return sorted(DIGEST.findall(text))


def _forms(base: Path, script: str, ranks: int) -> dict[str, subprocess.CompletedProcess]:
    """The script under each launcher, in a copy of the corpus of its own."""
    project = base / "project"
    shutil.copytree(CORPUS_DIR, project)
    env = dict(os.environ, TMPDIR=str(base))
    nproc = ["--nproc-per-node", str(ranks)]

    def run(*command: str) -> subprocess.CompletedProcess:
        for _ in range(TEARDOWN_TRIES):
            done = subprocess.run(list(command), cwd=project, capture_output=True,
                                  text=True, timeout=150, env=env)
            if done.returncode == 0 or TEARDOWN_ABORT not in done.stderr:
                break
            TEARDOWN_RETRIES.append((script, " ".join(command[1:4])))
        return done

    distdoctor = [sys.executable, "-m", "distdoctor"]
    return {
        "torchrun": run(*TORCHRUN, *nproc, script),
        "run": run(*distdoctor, "run", *nproc, "--deadline", "60", script),
        "run --": run(*distdoctor, "run", "--deadline", "60", "--", *TORCHRUN, *nproc,
                      script),
        "bootstrap": run(*TORCHRUN, *nproc, "-m", "distdoctor.userjob", "--trace-dir",
                         str(base / "traces"), script),
        "analyze": run(*distdoctor, "analyze", str(base / "traces")),
    }


@pytest.fixture(scope="module")
def corpus_runs(tmp_path_factory):
    """Every script under every form, two scripts at a time (each run spends most of its
    time starting interpreters; nothing here is judged by time)."""
    with ThreadPoolExecutor(2) as lanes:
        runs = {script: lanes.submit(_forms, tmp_path_factory.mktemp(script[:-3]), script,
                                     ranks) for script, ranks in CORPUS}
        return {script: run.result() for script, run in runs.items()}


@pytest.mark.timeout(600)  # the first test to ask pays for every run (module fixture)
def test_torchs_teardown_abort_stays_as_rare_as_torch_makes_it(corpus_runs):
    assert len(TEARDOWN_RETRIES) <= MOST_RETRIES, TEARDOWN_RETRIES


@pytest.mark.timeout(600)  # run alone, the first pays for every run (module fixture)
@pytest.mark.parametrize("script, ranks", CORPUS, ids=[s for s, _ in CORPUS])
def test_a_feature_runs_under_distdoctor_as_under_torchrun(corpus_runs, script, ranks):
    forms = corpus_runs[script]
    reference = forms["torchrun"]
    assert reference.returncode == 0, reference.stderr[-3000:]
    expected = _digests(reference.stdout)
    assert len(expected) >= ranks, reference.stdout
    for form in ("run", "run --", "bootstrap"):
        done = forms[form]
        assert done.returncode == reference.returncode, (form, done.stdout[-3000:],
                                                         done.stderr[-3000:])
        assert _digests(done.stdout) == expected, (form, done.stdout[-3000:])
        assert "Unable to cast" not in done.stderr and "Traceback" not in done.stderr, \
            (form, done.stderr[-3000:])
    assert f"distdoctor run: OK: all {ranks} ranks of {script} finished" in \
        forms["run"].stdout, forms["run"].stdout
    assert re.search(rf"distdoctor run: OK: all {ranks} ranks of .*{script} finished",
                     forms["run --"].stdout), forms["run --"].stdout
    assert forms["analyze"].returncode == 0, forms["analyze"].stdout
    assert forms["analyze"].stdout.startswith(f"distdoctor analyze: OK: all {ranks} ranks"), \
        forms["analyze"].stdout
