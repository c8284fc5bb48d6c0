"""A rank-0-only metric (as examples/rank_zero_metric.py): every rank then waits in the same
all-reduce line, and only the ranks' collective histories show where they parted. Each
rank serves the Flight Recorder dump pipe as nccl's process group does (a byte written to
``$TORCH_NCCL_DEBUG_INFO_PIPE_FILE<rank>.pipe`` makes it dump its recorder to
``$TORCH_FR_DUMP_TEMP_FILE<rank>`` and go on): gloo, the only backend here, has no such
pipe, so this job opens it itself, with torch's own dump."""

import os
import threading

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace


def serve_dump_pipe(rank: int) -> None:
    pipe = f"{os.environ['TORCH_NCCL_DEBUG_INFO_PIPE_FILE']}{rank}.pipe"
    os.mkfifo(pipe)

    def serve() -> None:
        while True:
            with open(pipe, "rb") as asked:
                if not asked.read(1):
                    continue
            dump = _dump_fr_trace(True, True, False)
            target = f"{os.environ['TORCH_FR_DUMP_TEMP_FILE']}{rank}"
            with open(target + ".tmp", "wb") as out:
                out.write(dump)
            os.replace(target + ".tmp", target)

    threading.Thread(target=serve, daemon=True).start()


dist.init_process_group("gloo")
rank = dist.get_rank()
serve_dump_pipe(rank)
t = torch.ones(4)
for step in range(3):
    dist.all_reduce(t)  # LOOP
    if rank == 0 and step == 1:
        dist.all_reduce(torch.ones(1))  # BUG: a metric only rank 0 reduces
dist.destroy_process_group()
