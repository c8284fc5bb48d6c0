"""A user's script for ``distdoctor run``: once the group is up, rank 0 writes every
listening socket of the launcher and of the ranks to the JSON file named by argv[1]."""

import json
import os
import sys

import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sockettable  # noqa: E402

dist.init_process_group("gloo")
ranks = [None] * dist.get_world_size()
dist.all_gather_object(ranks, os.getpid())  # and every rank's gloo listeners are up
if dist.get_rank() == 0:
    found = sockettable.listeners({os.getppid(), *ranks})  # the launcher hosts the store
    with open(sys.argv[1], "w") as out:
        json.dump([[l.pid, l.address, l.port] for l in found], out)
dist.barrier()
dist.destroy_process_group()
