"""A rank that writes down what a fresh interpreter would give it, for the start-method
tests: its environment, streams, signal dispositions, threads and random draws."""

import json
import os
import random
import signal
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"rank {rank} says hello", flush=True)
seen = {
    "rank": os.environ["RANK"], "world_size": os.environ["WORLD_SIZE"],
    "stdout_fd": sys.stdout.fileno(), "stdin_fd": sys.stdin.fileno(),
    "stderr_fd": sys.stderr.fileno(),
    "sigint_raises": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
    "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
    "threads": torch.get_num_threads(),
    "torch_draw": torch.rand(4).tolist(), "random_draw": random.random(),
    "main": __name__, "argv": sys.argv[1:], "cwd_on_path": os.getcwd() in sys.path,
}
with open(os.path.join(sys.argv[1], f"rank-{rank}.json"), "w") as out:
    json.dump(seen, out)
dist.barrier()
dist.destroy_process_group()
