"""Which dataset a sampler draws from, in brief: a digest of what the dataset object holds.

Why: a sample id is an index into a dataset, so two ranks drawing the same ids read the
same samples only if they index the same dataset. A script that gives each rank its own
shard of the data (``files[rank::world]``, a ``Subset`` of its own indices, a
pre-sharded dataset) draws ids 0..n on every rank from different data, by design; told
from the ids alone it would read as every rank training on the same samples.

How: the object's own attributes (``vars``, never properties or ``__getitem__``: reading
a sample could draw from the script's random streams), walked a few levels deep into
containers and nested objects, each container by its length and its first and last
items, each tensor or array by its type, shape and a few values at fixed positions. Equal
datasets give equal digests on every rank; a rank's own shard (other paths, other
indices, other values) gives another. Bounded: at most ``BUDGET`` values are read, once
per pass over a loader.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

from distdoctor.analysis.positions import spread_positions

DEPTH = 4  # nested objects and containers walked (a Subset's dataset's list of files)
ENDS = 16  # items read at each end of a container (and its length)
VALUES = 32  # values read of a tensor or array, at evenly spread positions
BUDGET = 4096  # values read in all: the digest costs microseconds to a millisecond


def dataset_digest(dataset: Any) -> str:
    """A short digest of ``dataset``'s contents as its attributes hold them."""
    walk = _Walk()
    walk.feed(dataset, DEPTH)
    return walk.hash.hexdigest()


class _Walk:
    def __init__(self) -> None:
        self.hash = hashlib.blake2b(digest_size=8)
        self.left = BUDGET
        self.seen: set[int] = set()

    def put(self, *parts: object) -> None:
        self.hash.update(repr(parts).encode())

    def feed(self, value: Any, depth: int) -> None:
        self.left -= 1
        if self.left < 0:
            return
        if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
            self.put(value)
        elif isinstance(value, torch.Tensor):
            self._tensor(value)
        elif isinstance(value, np.ndarray):
            self._array(value)
        elif id(value) in self.seen or depth <= 0:
            self.put(type(value).__qualname__)
        else:
            self.seen.add(id(value))
            self._container(value, depth)

    def _container(self, value: Any, depth: int) -> None:
        self.put(type(value).__qualname__)
        if isinstance(value, (list, tuple, range)):
            items: list = list(value[:ENDS]) + list(value[max(ENDS, len(value) - ENDS):])
            self.put(len(value))
        elif isinstance(value, dict):
            keys = sorted((k for k in value if isinstance(k, (str, int))), key=repr)
            items = [k for k in keys[:ENDS] + keys[max(ENDS, len(keys) - ENDS):]]
            items = [x for k in items for x in (k, value[k])]
            self.put(len(value))
        else:  # an object: its own attributes, in name order
            held = getattr(value, "__dict__", None)
            if not isinstance(held, dict):
                return
            names = sorted(name for name in held if isinstance(name, str))
            items = [x for name in names for x in (name, held[name])]
        for item in items:
            self.feed(item, depth - 1)

    def _tensor(self, t: torch.Tensor) -> None:
        self.put("tensor", tuple(t.shape), str(t.dtype))
        # values of plain tensors only: a subclass's ops may communicate (a DTensor's take
        # would be a collective on this rank alone) or be lazy
        if type(t) in (torch.Tensor, torch.nn.Parameter) and t.numel() \
                and t.layout == torch.strided and not t.is_meta:
            at = torch.tensor(spread_positions(t.numel(), VALUES))
            self.put(torch.take(t.detach(), at.to(t.device)).tolist())
            self.left -= VALUES

    def _array(self, a: np.ndarray) -> None:
        self.put("array", a.shape, str(a.dtype))
        if a.size:
            at = np.array(spread_positions(a.size, VALUES), dtype=np.int64)
            self.put(a.flat[at].tolist())
            self.left -= VALUES
