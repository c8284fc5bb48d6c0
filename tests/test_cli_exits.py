"""The command's exit codes where a person or a supervisor ends it, and where the verdict
fails: Ctrl-C is 130 and SIGTERM 143 (128 + the signal), with every rank stopped first;
a failing verdict is 1."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import uuid

import proctable
import pytest

from distdoctor import faults
from distdoctor.cli.main import main

pytestmark = pytest.mark.tier("e2e")

SCRIPT = """import os
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    with open(os.environ["DISTDOCTOR_CASES_FIFO"], "wb") as fifo:
        fifo.write(b"!")  # the ranks are up and about to hang
    while True:
        pass
dist.barrier()
"""


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
                         ids=["SIGINT", "SIGTERM"])
def test_a_signalled_run_stops_every_rank_and_exits_128_plus_the_signal(tmp_path, signum,
                                                                        code):
    script = tmp_path / "spins.py"
    script.write_text(SCRIPT)
    fifo = tmp_path / "reached"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    tag = uuid.uuid4().hex
    child = subprocess.Popen(
        [sys.executable, "-m", "distdoctor", "run", "--nproc-per-node", "2", str(script)],
        env=dict(os.environ, DISTDOCTOR_TEST_TAG=tag, DISTDOCTOR_CASES_FIFO=str(fifo)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=proctable.interruptible)
    try:
        assert select.select([reader], [], [], 120)[0], "the ranks never came up"
        ranks = proctable.tagged(tag) - {child.pid}
        assert len(ranks) >= 2
        child.send_signal(signum)
        out, err = child.communicate(timeout=60)
    finally:
        os.close(reader)
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == code, err
    if signum == signal.SIGINT:
        assert err.strip().endswith("distdoctor: interrupted; every rank was stopped")
    assert "Traceback" not in err
    assert proctable.wait_all_exit(sorted(ranks), 10) == set()


def test_train_exits_1_when_its_verdict_fails(monkeypatch, capsys):
    """train runs the clean baseline, which passes; here its spec carries a real fault
    (gradients summed, not averaged), so the real run's verdict fails."""
    import distdoctor.cli.train as train_cli

    spec_from = train_cli.spec_from
    monkeypatch.setattr(train_cli, "spec_from", lambda args, strategy: faults.get(
        "sum-without-mean").inject(spec_from(args, strategy)))
    code = main(["train", "--strategy", "ddp", "--world-size", "2", "--no-write"])
    printed = capsys.readouterr().out
    assert code == 1 and "FAIL" in printed
