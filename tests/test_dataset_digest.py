"""Which dataset a loader draws from (trace/datasets.py): equal on every rank for one
dataset, another for each rank's own shard, read from the object's attributes alone and
within a bound."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from distdoctor.trace import datasets
from distdoctor.trace.datasets import dataset_digest

pytestmark = pytest.mark.tier("unit")


class Files(Dataset):
    """A dataset of files, as scripts write them; ``__getitem__`` must never be called."""

    def __init__(self, files: list[str]) -> None:
        self.files, self.root = files, "/data"

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> str:
        raise AssertionError("a sample was read")

    @property
    def size(self) -> int:
        raise AssertionError("a property was read")


FILES = [f"shard-{i:05d}.bin" for i in range(100_000)]


def test_one_dataset_has_one_digest_and_each_ranks_shard_its_own():
    assert dataset_digest(Files(list(FILES))) == dataset_digest(Files(list(FILES)))
    assert dataset_digest(Files(FILES[0::2])) != dataset_digest(Files(FILES[1::2]))
    values = torch.arange(64.0).reshape(32, 2)
    assert dataset_digest(TensorDataset(values.clone())) == dataset_digest(TensorDataset(values))
    assert dataset_digest(TensorDataset(values)) != dataset_digest(TensorDataset(values + 1))
    whole = Files(FILES)
    assert dataset_digest(Subset(whole, range(0, 100, 2))) != \
        dataset_digest(Subset(whole, range(1, 100, 2)))


def test_the_digest_reads_within_its_budget_and_survives_cycles(monkeypatch):
    looped = Files(FILES)
    looped.parent = looped  # type: ignore[attr-defined]
    nested = Files([[list(range(1000))] * 1000] * 1000)  # type: ignore[list-item]
    read: list[int] = []
    original = datasets._Walk.feed

    def counted(walk, value, depth):
        read.append(1)
        original(walk, value, depth)

    monkeypatch.setattr(datasets._Walk, "feed", counted)
    dataset_digest(looped)
    dataset_digest(nested)
    assert len(read) <= 2 * datasets.BUDGET
