"""Which samples each rank's loaders hand out, pass by pass: the evidence for ranks that
read the same samples (no DistributedSampler) and for epochs that replay the one before
(a DistributedSampler never told the epoch).

Every batch sampler (what a DataLoader draws its index batches from) is patched at the
class, so a user's loader is seen without any change to the script.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from distdoctor.models.events import Ev
from distdoctor.trace.datasets import dataset_digest
from distdoctor.trace.tracer import incomplete, user_line


def record_batches(tracer: Any) -> None:
    """Make every batch sampler (what a DataLoader draws its index batches from) write
    down each batch's sample indices, with the pass it belongs to, the sampler's class
    and epoch, the script's line that iterates the loader, and how many optimiser
    steps had run: enough to tell duplicated shards and replayed epochs, and training
    loaders (an optimiser steps during their pass) from evaluation ones."""
    from torch.utils.data.sampler import BatchSampler

    tracer.count_optimizer_steps()
    objects: dict[int, tuple[Any, _Loader]] = {}  # id(batch sampler) -> (it, its loader)
    # (line, sampler class, data) -> the loaders iterated there, in order
    loops: dict[tuple[str, str, str], list[_Loader]] = {}
    original = BatchSampler.__iter__

    def batches(sampler: Any) -> Any:
        try:
            inner = getattr(sampler, "sampler", None)
            where, data = json.dumps(user_line()), _data_of(inner)
            loader = _loader_of(sampler, (where, type(inner).__name__, data), objects, loops)
            number, epoch = loader.number, loader.passes
            loader.passes, loader.open = loader.passes + 1, loader.open + 1
            # formatted by hand, the parts fixed for the pass once: a line per batch is on
            # the training loop's path (json.dumps of the whole was 3x the cost)
            head = json.dumps(dict(ev=Ev.BATCH, loader=number, epoch=epoch,
                                   sampler=type(inner).__name__,
                                   sampler_epoch=getattr(inner, "epoch", None),
                                   shuffles=_shuffles(inner), data=data),
                              separators=(",", ":"), default=repr)[:-1]
        # Reported as incomplete evidence, below; evidence is best effort: the user's loader goes
        # on.
        except Exception as exc:  # noqa: BLE001
            incomplete("the batches a loader drew", exc)
            yield from original(sampler)
            return
        try:
            for ids in original(sampler):
                try:
                    tracer.put(f'{head},"ids":[{",".join([str(int(i)) for i in ids])}],'
                               f'"steps":{tracer.optimizer_steps},"where":{where}}}')
                # Reported as incomplete evidence, below; ids that are not sample numbers, say.
                except Exception as exc:  # noqa: BLE001
                    incomplete("the batches a loader drew", exc)
                yield ids
        finally:
            loader.open -= 1
            tracer.write(ev=Ev.PASS_END, loader=number, epoch=epoch,
                         steps=tracer.optimizer_steps)

    setattr(BatchSampler, "__iter__", batches)  # noqa: B010 (a patch)


@dataclass
class _Loader:
    """One loader as the script sees it: its number, the passes begun over it, and how many
    are under way now."""

    number: int
    passes: int = 0
    open: int = 0


def _loader_of(sampler: Any, loop: tuple[str, str, str], objects: dict,
               loops: dict) -> _Loader:
    """The loader a batch sampler's pass belongs to. A script that makes its DataLoader
    anew each epoch (a new sampler object each time) iterates one loader: a new object
    iterated at the same line, with the same sampler class over the same dataset, takes
    the first such loader with no pass under way, so its epochs are compared like any
    other's. Loaders drawn side by side there (``zip``) stay apart, each epoch's first
    pass the first loader's. The object itself is held, so its id is never another's."""
    known = objects.get(id(sampler))
    if known is not None:
        return known[1]
    here = loops.setdefault(loop, [])
    loader = next((free for free in here if free.open == 0), None)
    if loader is None:
        loader = _Loader(number=sum(map(len, loops.values())))
        here.append(loader)
    objects[id(sampler)] = (sampler, loader)
    return loader


def _shuffles(sampler: Any) -> bool | None:
    """Does ``sampler`` draw each pass in a new order? torch's RandomSampler does, its
    SequentialSampler does not, a DistributedSampler as its ``shuffle`` says; another
    sampler's is not known (None)."""
    from torch.utils.data import RandomSampler, SequentialSampler

    if isinstance(sampler, RandomSampler):
        return True
    if isinstance(sampler, SequentialSampler):
        return False
    shuffle = getattr(sampler, "shuffle", None)
    return shuffle if isinstance(shuffle, bool) else None


def _data_of(sampler: Any) -> str:
    """The digest of the dataset ``sampler`` draws its ids from (torch's samplers name it
    ``data_source``, DistributedSampler ``dataset``); "" when it names none, or the
    digest fails (reported as incomplete evidence: ids are then judged as one dataset's)."""
    dataset = getattr(sampler, "data_source", None)
    if dataset is None:
        dataset = getattr(sampler, "dataset", None)
    if dataset is None:
        return ""
    try:
        return dataset_digest(dataset)
    except Exception as exc:  # noqa: BLE001 (reported as incomplete evidence)
        incomplete("which dataset a loader drew from", exc)
        return ""

