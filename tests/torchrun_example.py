"""An example under a real torchrun with distdoctor's in-rank bootstrap, as a user runs it
(``python -m torch.distributed.run ... -m distdoctor.userjob --trace-dir DIR script``):
the one way the tests start one, shared by every test that reads such traces."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import proctable

EXAMPLES = Path(__file__).parent.parent / "examples"


def _still_stalled(trace_dir: Path, rank: int, example: str) -> bool:
    """The rank's stacks are written since its watch last wrote a mark, at a stall it has
    not moved past (a rank that waited past its deadline once, for a peer slow to start,
    stalls, moves on, and may stall again later)."""
    from distdoctor.launch.stacks import MARK
    from distdoctor.trace.stalls import STALL_NOTED, still_stalled_in

    trace, stacks = (trace_dir / f"rank-{rank}{suffix}" for suffix in (".jsonl", ".stacks"))
    if not (trace.exists() and stacks.exists()):
        return False
    text = trace.read_bytes()
    latest = stacks.read_text().rpartition(MARK)[2]
    # a rank busy holding the GIL cannot note its stall: a peer's poke dumps its stacks
    noted = STALL_NOTED in text
    return (still_stalled_in(text) or not noted) and example in latest


def torchrun_example(trace_dir: Path, example: str, ranks: int, hangs: bool = False,
              flags: tuple[str, ...] = (), deadline: float = 2.0,
              env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``example`` under a real torchrun with the in-rank bootstrap; if it ``hangs``,
    stop it with SIGTERM, as a user would, once every rank has written its stall stacks
    (each rank does so by itself at its 2 s deadline). torchrun's exit code and stderr."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(ranks), "-m", "distdoctor.userjob", "--trace-dir",
               str(trace_dir), "--deadline", str(deadline), *flags, example]
    stderr = trace_dir.parent / f"{trace_dir.name}.stderr"
    # torchrun's agent leaves its torchelastic_* directory behind when workers fail
    scratch = trace_dir.parent / f"{trace_dir.name}-tmp"
    scratch.mkdir()
    tag = uuid.uuid4().hex  # every process torchrun starts inherits it: leaks are found
    with stderr.open("w") as err:
        process = subprocess.Popen(command, cwd=EXAMPLES, stdout=subprocess.DEVNULL,
                                   stderr=err, start_new_session=True,
                                   env=dict(os.environ, TMPDIR=str(scratch),
                                            DISTDOCTOR_TEST_TAG=tag, **(env or {})))
    def stalled() -> bool:
        return all(_still_stalled(trace_dir, rank, example) for rank in range(ranks))

    try:
        if not hangs:
            return process.wait(120), stderr.read_text()
        give_up = time.monotonic() + 60
        while not stalled() and time.monotonic() < give_up:
            try:
                process.wait(0.1)  # returns at once if torchrun ended: it should not have
                break
            except subprocess.TimeoutExpired:
                pass
        assert stalled(), "the ranks did not write their stall stacks within 60 s"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(30)
        assert proctable.wait_all_exit(sorted(proctable.tagged(tag)), 10) == set()
    return process.returncode, stderr.read_text()
