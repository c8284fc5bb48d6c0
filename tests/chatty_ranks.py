"""A user's script whose ranks print at once: many lines each, written unbuffered (print's
text and its newline are then two writes), to stdout and stderr, and a last line left
without its newline."""

import sys

import torch.distributed as dist

LINES = int(sys.argv[1]) if len(sys.argv) > 1 else 500

sys.stdout.reconfigure(write_through=True)
dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()  # both ranks start printing together
for i in range(LINES):
    print(f"rank {rank} line {i} loss {0.5 * i:.4f}")
    if i % 100 == 0:
        print(f"rank {rank} note {i}", file=sys.stderr)
dist.barrier()
print(f"rank {rank} done", end="")
dist.destroy_process_group()
