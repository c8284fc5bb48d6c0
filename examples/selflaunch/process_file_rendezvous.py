"""Teaching code's other way to start ranks: ``multiprocessing.Process`` and a ``file://``
rendezvous. Rank 1's data fails to load; rank 0 waits in its all-reduce for a rank that
is gone. ``multiprocessing`` prints rank 1's traceback among the others' output and the
parent sees exit codes only; ``distdoctor run -- python process_file_rendezvous.py``
names rank 1's error first, at its line.
"""

import multiprocessing
import os
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist


def load_shard(rank: int) -> torch.Tensor:
    if rank == 1:
        raise FileNotFoundError(f"shard-{rank}.pt")  # BUG: this rank's shard is missing
    return torch.ones(4)


def worker(rank: int, world_size: int, init_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size)
    data = load_shard(rank)
    dist.all_reduce(data)
    print(f"rank {rank}: {data.tolist()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size = 2
    folder = tempfile.mkdtemp()
    init_file = os.path.join(folder, "rendezvous")
    ranks = [multiprocessing.Process(target=worker, args=(rank, world_size, init_file))
             for rank in range(world_size)]
    try:
        for process in ranks:
            process.start()
        for process in ranks:
            process.join()
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # the store's file, once every rank is done
    sys.exit(max(abs(process.exitcode or 0) for process in ranks))
