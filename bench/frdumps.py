"""Synthetic Flight Recorder dumps of an nccl job, in torch's own schema, at any scale.

What this machine cannot run (thousands of ranks, nccl's point-to-point records, its
"started"/"completed" states and durations) is written here as torch writes it: one
pickle (protocol 2, each string and frame written once and referred to after, as torch's
pickler does) or JSON per rank, named ``nccl_trace_rank_<rank>``, holding the newest
``entries`` operations of a job whose older ones the ring buffer dropped.

The job: ``world`` ranks in tensor-parallel groups of ``tp`` (consecutive ranks) and data-
parallel groups across them, as ``init_device_mesh`` makes; each step makes an all-gather
and a reduce-scatter on its TP group, an all-reduce of gradients on its DP group and an
all-reduce of the loss on the default group. The job hangs in its last step, and one
``case`` says why (``culprit`` is the rank at fault):

* ``healthy``: no hang; every operation completed (a dump taken on demand);
* ``extra``: the culprit makes an extra all-reduce of 1 element on its DP group;
* ``size``: the culprit's DP all-reduce has half the elements of its peers';
* ``behind``: the culprit never reaches the last step's all-gather (stuck in its own code);
* ``coalesced``: the culprit's coalesced all-gather holds one tensor fewer;
* ``p2p``: a pipeline of ``world`` stages on the default group; the culprit and the
  next stage both send first (each waits for the other to receive).

Versions: "2.3" to "2.10". Fields as torch's reader (``fr_trace``, which reads
``is_p2p``, ``p2p_seq_id`` and the dtypes in every version it takes) and the dumps of
torch 2.13 show them: ``timeout_ms`` and ``pg_status`` from 2.5, ``thread_id`` and
``thread_name`` from 2.8; before 2.4 all-to-all sizes were not logged. (Which version
added which of the later fields is this generator's reading of torch's history, not
checked against dumps of each torch release: none is installed here.)

    python bench/frdumps.py OUT --world 64 --case extra --culprit 5 [--json] [--version 2.7]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
from dataclasses import dataclass

CASES = ("healthy", "extra", "size", "behind", "coalesced", "p2p")
VERSIONS = tuple(f"2.{minor}" for minor in range(3, 11))
USER_FILE = "/home/user/project/train.py"
LINES = {"all_gather": 41, "reduce_scatter": 47, "grad": 55, "loss": 61, "extra": 58,
         "send": 72, "recv": 70, "coalesced": 44}
NAMES = {"all_gather": "nccl:_all_gather_base", "reduce_scatter": "nccl:_reduce_scatter_base",
         "grad": "nccl:all_reduce", "loss": "nccl:all_reduce", "extra": "nccl:all_reduce",
         "coalesced": "nccl:ALLGATHER_coalesced"}
SHARD = 4096  # elements of a rank's shard in the TP collectives
GRADS = 65536  # elements of the DP gradient all-reduce


@dataclass(frozen=True)
class Job:
    world: int
    tp: int
    entries: int  # kept per rank (the ring buffer's size)
    case: str
    culprit: int
    version: str = "2.10"
    steps: int | None = None  # made in all; by default enough to wrap the buffer


def _frames_table() -> dict[str, list[dict]]:
    """Each call's Python stack, innermost first: torch's frames, then the user's line.
    The same dict objects are referred to from every entry (torch writes a frame once)."""
    torch_dir = "/opt/conda/lib/python3.11/site-packages/torch"
    table = {}
    for kind, line in LINES.items():
        table[kind] = [
            {"name": "all_reduce", "filename": f"{torch_dir}/distributed/distributed_c10d.py",
             "line": 2500 + line},
            {"name": "wrapper", "filename": f"{torch_dir}/distributed/c10d_logger.py",
             "line": 83},
            {"name": "train_step", "filename": USER_FILE, "line": line},
            {"name": "main", "filename": USER_FILE, "line": 120},
            {"name": "<module>", "filename": USER_FILE, "line": 130}]
    return table


FRAMES = _frames_table()


def groups_of(job: Job, rank: int) -> dict[str, tuple[str, str, tuple[int, ...]]]:
    """kind -> (torch's group name, description, global ranks) of the rank's groups:
    the default group "0", then the TP groups "1".."world/tp", then the DP groups."""
    tp_index, tp_rank = divmod(rank, job.tp)
    found = {"loss": ("0", "default_pg", tuple(range(job.world)))}
    if job.case == "p2p":
        return found
    found["tp"] = (str(1 + tp_index), "mesh_tp",
                   tuple(range(tp_index * job.tp, (tp_index + 1) * job.tp)))
    found["dp"] = (str(1 + job.world // job.tp + tp_rank), "mesh_dp",
                   tuple(range(tp_rank, job.world, job.tp)))
    return found


def _program(job: Job, rank: int) -> list[tuple[str, str, tuple, str]]:
    """The rank's operations in order: (kind, group key, input sizes, state)."""
    steps = job.steps or (job.entries // 4 + 60)
    ops: list[tuple[str, str, tuple, str]] = []
    if job.case == "p2p":
        return _pipeline(job, rank, steps)
    for step in range(steps):
        last = step == steps - 1
        if job.case == "behind" and last and rank == job.culprit:
            break  # stuck in its own code before the step's first collective
        gather = ("coalesced", "tp", ((SHARD,),) * (2 if rank == job.culprit else 3)) \
            if job.case == "coalesced" and last else ("all_gather", "tp", ((SHARD,),))
        ops.append((*gather, ""))
        ops.append(("reduce_scatter", "tp", ((SHARD * job.tp,),), ""))
        size = GRADS // 2 if job.case == "size" and last and rank == job.culprit else GRADS
        ops.append(("grad", "dp", ((size,),), ""))
        if job.case == "extra" and last and rank == job.culprit:
            ops.append(("extra", "dp", ((1,),), ""))
        ops.append(("loss", "loss", ((1,),), ""))
    if job.case == "healthy":
        return [(k, g, s, "completed") for k, g, s, _ in ops]
    stuck = _first_stuck(job, rank, ops)
    return [(k, g, s, "completed" if i < stuck else "started" if i == stuck else "scheduled")
            for i, (k, g, s, _) in enumerate(ops[:stuck + 1])]


def _first_stuck(job: Job, rank: int, ops: list) -> int:
    """The position of the operation this rank waits in, as an nccl job stops in its last
    step: the culprit's groups wait for it, the rest at the loss all-reduce."""
    start = len(ops) - (5 if job.case == "extra" and rank == job.culprit else 4)
    gather, grad, loss = start, start + 2, len(ops) - 1
    same_tp = rank // job.tp == job.culprit // job.tp
    same_dp = rank % job.tp == job.culprit % job.tp
    if job.case == "behind":
        if rank == job.culprit:
            return len(ops)  # all it made completed; it is in its own code
        return gather if same_tp else grad if same_dp else loss
    if job.case == "extra":
        return start + 3 if rank == job.culprit else loss
    if job.case == "size":
        return grad if same_dp else loss
    return gather if same_tp else grad if same_dp else loss  # coalesced


def _pipeline(job: Job, rank: int, steps: int) -> list[tuple[str, str, tuple, str]]:
    """Stage ``rank`` of ``world`` on the default group: each micro-batch received from the
    stage before and sent to the next, then the loss all-reduced. In the last step the
    culprit and the next stage send to each other first: both sends wait; the stages
    before pile up behind the culprit, those after wait to receive."""
    culprit, world, batch = job.culprit, job.world, ((8, SHARD),)
    ops: list[tuple[str, str, tuple, str]] = []
    for _ in range(steps - 1):
        if rank > 0:
            ops.append((f"recv:{rank - 1}", "loss", batch, "completed"))
        if rank < world - 1:
            ops.append((f"send:{rank + 1}", "loss", batch, "completed"))
        ops.append(("loss", "loss", ((1,),), "completed"))
    if rank in (culprit, culprit + 1):
        peer = culprit + 1 if rank == culprit else culprit
        return ops + [(f"send:{peer}", "loss", batch, "started")]
    if rank > culprit + 1:
        return ops + [(f"recv:{rank - 1}", "loss", batch, "started")]
    if rank > 0:
        ops.append((f"recv:{rank - 1}", "loss", batch, "completed"))
    if rank == culprit - 1:
        return ops + [(f"send:{rank + 1}", "loss", batch, "started")]
    return ops + [(f"send:{rank + 1}", "loss", batch, "completed"),
                  ("loss", "loss", ((1,),), "started")]


def dump_of(job: Job, rank: int) -> dict:
    """The rank's dump as torch writes it (plain data)."""
    minor = int(job.version.split(".")[1])
    groups = groups_of(job, rank)
    local_id = {key: index for index, key in enumerate(groups)}
    counters: dict[str, list[int]] = {key: [0, 0, 0] for key in groups}  # coll, p2p, op
    program = _program(job, rank)
    first = max(0, len(program) - job.entries)
    entries = []
    status: dict[str, dict[str, int]] = {}
    base = 1_796_450_000_000_000_000 + rank * 7_919
    for record_id, (kind, key, sizes, state) in enumerate(program):
        name, desc, members = groups[key]
        counter = counters[key]
        p2p = kind.startswith(("send", "recv"))
        counter[2] += 1
        if p2p:
            counter[1] += 1
        else:
            counter[0] += 1
        if record_id < first:
            continue
        if p2p:
            op, peer = kind.split(":")
            me, other = members.index(rank), members.index(int(peer))
            profiling = f"nccl:send {me}->{other}" if op == "send" else \
                f"nccl:recv {me}<-{other}"
        else:
            profiling = NAMES[kind]
        created = base + record_id * 1_000_000
        done = state == "completed"
        entry = {
            "record_id": record_id, "pg_id": local_id[key], "process_group": (name, desc),
            "collective_seq_id": 0 if p2p else counter[0], "p2p_seq_id": counter[1] if p2p
            else 0, "op_id": counter[2], "profiling_name": profiling,
            "time_created_ns": created,
            "input_sizes": [list(s) for s in sizes] if (minor > 3 or "to_all" not in kind)
            else [], "input_dtypes": ["Float"] * len(sizes),
            "output_sizes": [list(s) for s in _outputs(kind, sizes, len(members))],
            "output_dtypes": ["Float"] * len(sizes), "state": state or "scheduled",
            "time_discovered_started_ns": created + 5_000 if state != "scheduled" else None,
            "time_discovered_completed_ns": created + 90_000 if done else None,
            "retired": done, "frames": FRAMES[kind.split(":")[0]]}
        if done:
            entry["duration_ms"] = 0.085
        entry["is_p2p"] = p2p
        if minor >= 5:
            entry["timeout_ms"] = 600_000
        if minor >= 8:
            entry["thread_id"] = str(140_000_000 + rank)
            entry["thread_name"] = "pt_main_thread"
        entries.append(entry)
        if minor >= 5:
            mine = status.setdefault(str(local_id[key]), {
                "last_enqueued_collective": -1, "last_started_collective": -1,
                "last_completed_collective": -1})
            mine["last_enqueued_collective"] = counter[2]
            if state in ("started", "completed"):
                mine["last_started_collective"] = counter[2]
            if done:
                mine["last_completed_collective"] = counter[2]
    dump: dict = {"version": job.version, "pg_config": {
        name: {"name": name, "desc": desc, "ranks": str(list(members))}
        for name, desc, members in groups.values()}}
    if minor >= 5:
        dump["pg_status"] = status
    dump["comm_lib_version"] = "2.21.5"
    dump["entries"] = entries
    return dump


def _outputs(kind: str, sizes: tuple, group: int) -> tuple:
    if kind in ("all_gather", "coalesced"):
        return tuple((s[0] * group,) for s in sizes)
    if kind == "reduce_scatter":
        return tuple((s[0] // group,) for s in sizes)
    return sizes


def write(job: Job, out: str, ranks: range | None = None, as_json: bool = False) -> None:
    """Each rank's dump into ``out``/nccl_trace_rank_<rank>."""
    os.makedirs(out, exist_ok=True)
    for rank in ranks if ranks is not None else range(job.world):
        dump = dump_of(job, rank)
        path = os.path.join(out, f"nccl_trace_rank_{rank}")
        if as_json:
            for entry in dump["entries"]:  # JSON has no tuples
                entry["process_group"] = list(entry["process_group"])
            with open(path, "w") as file:
                json.dump(dump, file)
        else:
            with open(path, "wb") as file:
                pickle.dump(dump, file, protocol=2)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--tp", type=int, default=4)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--case", choices=CASES, default="extra")
    parser.add_argument("--culprit", type=int, default=1)
    parser.add_argument("--version", choices=VERSIONS, default="2.10")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    job = Job(args.world, args.tp, args.entries, args.case, args.culprit, args.version)
    write(job, args.out, as_json=args.json)
    print(f"wrote {args.world} dumps to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
