"""Run a script on WORLD ranks with no launcher of ours and nothing of distdoctor in them,
and leave torch's own Flight Recorder dumps, as an nccl job's watchdog would on a timeout.

    python fr_dumps.py OUT WORLD SCRIPT [DUMPS]

Each rank runs SCRIPT (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, as torchrun
sets them) with a thread that watches its own recorder: once an operation has stayed
enqueued and not completed for HOLD_S, the rank is hung, and it writes
``torch._C._distributed_c10d._dump_fr_trace(True, True, False)`` (the pickle nccl's
watchdog writes) to ``OUT/nccl_trace_rank_<rank>`` and exits. A rank whose script raises
(gloo answers a peer that left with "Connection reset") dumps on its way out, as nccl's
does when it aborts; a rank that exits, or that gloo aborts, leaves no dump, as on a
cluster. With FR_DUMP_AT_EXIT=1 a rank also dumps as its script ends (a job that went on,
dumped on demand). The job is ended once DUMPS ranks (every rank, by default) have dumped,
or after DEADLINE_S.
"""

import json
import os
import runpy
import signal
import socket
import subprocess
import sys
import threading
import time

HOLD_S = 1.0
DEADLINE_S = 60.0


def dump(out: str, rank: int) -> None:
    from torch._C._distributed_c10d import _dump_fr_trace

    target = os.path.join(out, f"nccl_trace_rank_{rank}")
    with open(target + ".tmp", "wb") as file:
        file.write(_dump_fr_trace(True, True, False))
    os.replace(target + ".tmp", target)


def watch(out: str, rank: int) -> None:
    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace_json

    while not dist.is_initialized():
        time.sleep(0.02)
    seen, since = None, time.monotonic()
    while True:
        status = json.loads(_dump_fr_trace_json(includeCollectives=False,
                                                onlyActive=False)).get("pg_status", {})
        now = {k: (v["last_enqueued_collective"], v["last_completed_collective"])
               for k, v in status.items()}
        if now != seen:
            seen, since = now, time.monotonic()
        elif any(e > c for e, c in now.values()) and time.monotonic() - since > HOLD_S:
            dump(out, rank)
            os._exit(0)
        time.sleep(0.05)


def rank_main(out: str, script: str) -> None:
    rank = int(os.environ["RANK"])
    threading.Thread(target=watch, args=(out, rank), daemon=True).start()

    def on_error(kind, value, tb):
        sys.__excepthook__(kind, value, tb)
        try:
            dump(out, rank)
        finally:
            os._exit(1)

    sys.excepthook = on_error
    sys.argv = [script]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as python SCRIPT does
    runpy.run_path(script, run_name="__main__")
    if os.environ.get("FR_DUMP_AT_EXIT") == "1":
        dump(out, rank)


def main(out: str, world: int, script: str, dumps: int) -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ranks = [subprocess.Popen(
        [sys.executable, __file__, "--rank", out, script],
        env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world),
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        for r in range(world)]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the finally below reaps
    try:
        wait_for_dumps(ranks, out, dumps)
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
            process.wait()
        for name in os.listdir(out):  # a dump a rank was writing as it was ended
            if name.endswith(".tmp"):
                os.remove(os.path.join(out, name))
    return 0


def wait_for_dumps(ranks: list, out: str, dumps: int) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline and any(p.poll() is None for p in ranks):
        written = [n for n in os.listdir(out) if n.startswith("nccl_trace_rank_")
                   and not n.endswith(".tmp")]
        if len(written) >= dumps:
            break
        time.sleep(0.05)


if __name__ == "__main__":
    if sys.argv[1] == "--rank":
        rank_main(sys.argv[2], sys.argv[3])
    else:
        world = int(sys.argv[2])
        sys.exit(main(sys.argv[1], world, sys.argv[3],
                      int(sys.argv[4]) if len(sys.argv) > 4 else world))
