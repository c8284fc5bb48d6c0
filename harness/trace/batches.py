"""Which samples each rank's loaders hand out, pass by pass: the evidence for ranks that
read the same samples (no DistributedSampler) and for epochs that replay the one before
(a DistributedSampler never told the epoch).

Every batch sampler (what a DataLoader draws its index batches from) is patched at the
class, so a user's loader is seen without any change to the script.
"""

from __future__ import annotations

import json
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
    loaders: dict[int, tuple[Any, int, list[int]]] = {}  # id -> (sampler, number, passes)
    original = BatchSampler.__iter__

    def batches(sampler: Any) -> Any:
        try:
            entry = loaders.setdefault(id(sampler), (sampler, len(loaders), [0]))
            number, passes = entry[1], entry[2]
            epoch, passes[0] = passes[0], passes[0] + 1
            inner = getattr(sampler, "sampler", None)
            # formatted by hand, the parts fixed for the pass once: a line per batch is on
            # the training loop's path (json.dumps of the whole was 3x the cost)
            head = json.dumps(dict(ev=Ev.BATCH, loader=number, epoch=epoch,
                                   sampler=type(inner).__name__,
                                   sampler_epoch=getattr(inner, "epoch", None),
                                   shuffles=_shuffles(inner), data=_data_of(inner)),
                              separators=(",", ":"), default=repr)[:-1]
        # Reported as incomplete evidence, below; evidence is best effort: the user's loader goes
        # on.
        except Exception as exc:  # noqa: BLE001
            incomplete("the batches a loader drew", exc)
            yield from original(sampler)
            return
        where = None
        try:
            for ids in original(sampler):
                try:
                    if where is None:
                        where = json.dumps(user_line())
                    tracer.put(f'{head},"ids":[{",".join([str(int(i)) for i in ids])}],'
                               f'"steps":{tracer.optimizer_steps},"where":{where}}}')
                # Reported as incomplete evidence, below; ids that are not sample numbers, say.
                except Exception as exc:  # noqa: BLE001
                    incomplete("the batches a loader drew", exc)
                yield ids
        finally:
            tracer.write(ev=Ev.PASS_END, loader=number, epoch=epoch,
                         steps=tracer.optimizer_steps)

    setattr(BatchSampler, "__iter__", batches)  # noqa: B010 (a patch)


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

