"""What every transparency script prints: one line a rank that says what it ended with, so
a run under torchrun and one under distdoctor can be compared line for line."""

import os
import sys

import torch
import torch.distributed as dist


def digest(label: str, tensors) -> None:
    """Print ``label rank: sum`` of ``tensors`` (parameters, results), rounded so that
    the same arithmetic gives the same line."""
    total = sum(float(t.detach().double().sum()) for t in tensors)
    sys.stdout.flush()  # one write of the whole line: ranks sharing a pipe never split it
    os.write(sys.stdout.fileno(), f"{label} rank {dist.get_rank()}: {total:.6f}\n".encode())


def data(rank: int, steps: int, size: int = 8, width: int = 4):
    """Each rank's own batches, the same for every run of the script."""
    generator = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(size, width, generator=generator),
             torch.randn(size, 1, generator=generator)) for _ in range(steps)]
