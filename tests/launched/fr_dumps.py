"""Run a script on WORLD ranks with no launcher of ours and nothing of distdoctor in them,
and leave torch's own Flight Recorder dumps, as an nccl job's watchdog would on a timeout.

    python fr_dumps.py OUT WORLD SCRIPT [DUMPS]

Each rank, forked from this process once it has imported torch, runs SCRIPT (RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, as torchrun sets them) with a thread that
watches its own recorder: once an operation has stayed enqueued and not completed for
HOLD_S while its main thread is inside torch's collectives, the rank is hung, and it
writes ``torch._C._distributed_c10d._dump_fr_trace(True, True, False)`` (the pickle
nccl's watchdog writes; ``_dump_fr_trace_json`` with FR_DUMP_JSON=1) to
``OUT/nccl_trace_rank_<rank>`` and waits on, as a hung rank does. A rank that was only
slow (a loaded machine can hold a healthy rank in a collective for longer than HOLD_S, while
its peer waits for a core) moves on: its dump is removed, since it is not of the hang, and
it is watched as before. A rank whose script
raises (gloo answers a peer that left with "Connection reset") dumps on its way out, as
nccl's does when it aborts; a rank that exits, or that gloo aborts, leaves no dump, as on
a cluster. With
FR_DUMP_AT_EXIT=1 a rank also dumps as its script ends (a job that went on, dumped on
demand). The job is ended once DUMPS ranks (every rank, by default) have dumped, or after
DEADLINE_S.
"""

import contextlib
import json
import os
import runpy
import signal
import socket
import sys
import threading
import time
import traceback

HOLD_S = 1.0
DEADLINE_S = 60.0
KEPT: list = []  # the script's globals, never freed (see rank_main)


def dump(out: str, rank: int) -> None:
    from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

    target = os.path.join(out, f"nccl_trace_rank_{rank}")
    written = _dump_fr_trace_json(includeCollectives=True, onlyActive=False) \
        if os.environ.get("FR_DUMP_JSON") == "1" else _dump_fr_trace(True, True, False)
    with open(target + ".tmp", "wb") as file:
        file.write(written)
    os.replace(target + ".tmp", target)


def watch(out: str, rank: int) -> None:
    """Dump once an operation has stayed enqueued and not completed for HOLD_S while the
    main thread is inside torch's collectives (its Python stack in torch.distributed, DDP
    or autograd): gloo's status can lag a completed collective, and a rank idle in code of
    its own is not hung in one."""
    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace_json

    while not dist.is_initialized():
        time.sleep(0.02)
    main = threading.main_thread().ident
    seen, since, dumped = None, time.monotonic(), False
    while True:
        status = json.loads(_dump_fr_trace_json(includeCollectives=False,
                                                onlyActive=False)).get("pg_status", {})
        now = {k: (int(v["last_enqueued_collective"]), int(v["last_completed_collective"]))
               for k, v in status.items()}
        if now != seen:
            if dumped:  # it moved on: slow, not hung, and its dump is not of the hang
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(out, f"nccl_trace_rank_{rank}"))
                dumped = False
            seen, since = now, time.monotonic()
        elif not dumped and any(e > c for e, c in now.values()) \
                and time.monotonic() - since > HOLD_S \
                and in_torch(sys._current_frames().get(main)):
            dump(out, rank)  # the rank stays in its collective, as a hung nccl rank does,
            dumped = True  # until the job is ended: a rank that left would make its peers
            # fail instead of wait
        time.sleep(0.05)


def in_torch(frame) -> bool:
    while frame is not None:
        name = frame.f_code.co_filename
        if any(part in name for part in (f"torch{os.sep}distributed{os.sep}",
                                         f"torch{os.sep}nn{os.sep}parallel{os.sep}",
                                         f"torch{os.sep}autograd{os.sep}")):
            return True
        frame = frame.f_back
    return False


def rank_main(out: str, script: str) -> None:
    """A rank: RANK and the rendezvous in its environment, SCRIPT run as ``python SCRIPT``
    runs it; an exception dumps on the way out, as nccl's process group does on an
    error; ``sys.exit`` (a rank that leaves) does not."""
    rank = int(os.environ["RANK"])
    threading.Thread(target=watch, args=(out, rank), daemon=True).start()
    sys.argv = [script]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as python SCRIPT does
    try:
        KEPT.append(runpy.run_path(script, run_name="__main__"))
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 (printed, dumped, and the job exits 1 as a crash)
        traceback.print_exc()
        dump(out, rank)
        os._exit(1)
    if os.environ.get("FR_DUMP_AT_EXIT") == "1":
        dump(out, rank)
    # The script's objects are never freed: torch 2.13 can deadlock freeing a DDP whose
    # gloo group was destroyed (~Reducer joins gloo's worker while holding the GIL, and
    # the worker waits for the GIL to free a finished work), seen here in 3 of 10 runs
    # of eval_on_rank0_module.py, the dump never written. A forked rank skips the
    # interpreter's teardown anyway; this one leaves as its script ended.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def start_rank(rank: int, world: int, port: int, out: str, script: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    rank_main(out, script)


def main(out: str, world: int, script: str, dumps: int) -> int:
    """The ranks are forked from this process once it has imported torch and set up its
    symbolizer (torchrun's children each pay for both; a fork shares them, and each rank
    is still its own process with its own gloo group)."""
    import multiprocessing

    import torch.distributed  # noqa: F401 (imported once, before the fork)
    from torch._C._profiler import gather_traceback, symbolize_tracebacks

    # a process's first dump with frames sets up torch's symbolizer (1.2 s here, 4 s on
    # a loaded machine); set up once here, every forked rank dumps in a millisecond
    symbolize_tracebacks([gather_traceback(True, True, True)])

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    fork = multiprocessing.get_context("fork")
    ranks = [fork.Process(target=start_rank, args=(r, world, port, out, script))
             for r in range(world)]
    for process in ranks:
        process.start()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the finally below reaps
    try:
        wait_for_dumps(ranks, out, dumps)
    finally:
        for process in ranks:
            if process.is_alive():
                process.kill()
            process.join()
        for name in os.listdir(out):  # a dump a rank was writing as it was ended
            if name.endswith(".tmp"):
                os.remove(os.path.join(out, name))
    return 0


def wait_for_dumps(ranks: list, out: str, dumps: int) -> None:
    """Until DUMPS dumps have stayed written for HOLD_S (or every rank ended, or the
    deadline). Not as soon as they are written: a rank whose collective gloo then fails
    has moved on, so its watcher removes the dump it wrote while it seemed hung, and its
    error path dumps again a moment later (seen once: the job ended between the two, the
    rank killed while printing its traceback, one dump of two left)."""
    deadline = time.monotonic() + DEADLINE_S
    held_since = None
    while time.monotonic() < deadline and any(p.is_alive() for p in ranks):
        written = [n for n in os.listdir(out) if n.startswith("nccl_trace_rank_")
                   and not n.endswith(".tmp")]
        if len(written) < dumps:
            held_since = None
        elif held_since is None:
            held_since = time.monotonic()
        elif time.monotonic() - held_since >= HOLD_S:
            break
        time.sleep(0.05)


if __name__ == "__main__":
    world = int(sys.argv[2])
    sys.exit(main(sys.argv[1], world, sys.argv[3],
                  int(sys.argv[4]) if len(sys.argv) > 4 else world))
