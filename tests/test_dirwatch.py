"""The torchrun path's proof, on hand-written trace files: what it proves, and what it
leaves to the deadline (a rank's trace missing, or an earlier run's)."""

from __future__ import annotations

import json

import pytest

from distdoctor.analysis.waitfor import CONFIRM_S
from distdoctor.userjob.watching.dirwatch import TraceDirectory, read_proof, write_proof

pytestmark = pytest.mark.tier("e2e")


def trace(folder, rank: int, run: str, *events: dict) -> None:
    lines = [{"ev": "start", "t": 0.0, "run": run, "rank": rank, "world": 2}, *events]
    (folder / f"rank-{rank}.jsonl").write_text(
        "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in lines))


def send(peer: int) -> dict:
    return {"ev": "enter", "id": 1, "t": 0.0, "op": "send", "seq": 0, "group": [0, 1],
            "peer": peer, "peers": [], "shapes": [[4]], "dtype": "float32",
            "reduce_op": None, "where": "s.py:3", "async_op": False}


def test_a_send_cycle_in_the_files_is_proven_once_it_has_held(tmp_path):
    for rank in (0, 1):
        trace(tmp_path, rank, "run-a", send(1 - rank))
    watching = TraceDirectory(tmp_path, 2, "run-a")
    assert watching.proof(10.0) is None  # seen once: not yet believed
    proof = watching.proof(10.0 + CONFIRM_S)
    assert proof is not None and (proof.kind, proof.ranks) == ("cycle", (0, 1))
    write_proof(tmp_path, "run-a", proof)
    assert read_proof(tmp_path, "run-a") == proof.text
    assert read_proof(tmp_path, "run-b") is None  # another run's proof is not this one's


def test_a_missing_or_earlier_trace_proves_nothing(tmp_path):
    trace(tmp_path, 0, "run-a", send(1))
    watching = TraceDirectory(tmp_path, 2, "run-a")
    assert watching.proof(10.0) is None and watching.proof(20.0) is None  # rank 1: none
    trace(tmp_path, 1, "run-old", send(0))  # not yet overwritten by this run's rank 1
    assert watching.proof(30.0) is None and watching.proof(40.0) is None
    trace(tmp_path, 1, "run-a", send(0))
    assert watching.proof(50.0) is None and watching.proof(50.0 + CONFIRM_S) is not None


def test_a_new_line_from_any_rank_restarts_the_confirmation(tmp_path):
    for rank in (0, 1):
        trace(tmp_path, rank, "run-a", send(1 - rank))
    watching = TraceDirectory(tmp_path, 2, "run-a")
    assert watching.proof(10.0) is None
    with open(tmp_path / "rank-1.jsonl", "a") as more:
        more.write('{"ev":"tick"}\n')
    assert watching.proof(10.0 + CONFIRM_S) is None  # something moved: held anew
    assert watching.proof(10.0 + 2 * CONFIRM_S) is not None
