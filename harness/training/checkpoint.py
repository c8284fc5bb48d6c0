"""A restart in the middle of training, as a job that checkpoints and is restarted has one.

After step K every rank saves its training state with torch.distributed.checkpoint (DCP)
into one folder, forgets it as a restarted process would hold it (its parameters and
optimiser state as first built, a fresh scheduler, its RNG as first seeded, the loader at
the start), and loads the checkpoint back. Each part is digested as saved and as loaded
(RestartEvidence): a correct resume reads every part back as it was, which is what a run
that never stopped holds at that point, so the run then trains on as the reference does.
The knobs say what the checkpoint keeps, as the classic resume bugs lose it.

Restarting in place, not in a new process, keeps the rank pool warm; what the restart
forgets is everything a new process would not have, part by part.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from distdoctor.models import RestartEvidence, RunSpec
from distdoctor.training.fingerprint import fingerprint
from distdoctor.training.workload import make_scheduler

PARTS = ("parameters", "optimizer state", "scheduler", "RNG state", "sampler")


@dataclass
class LoaderPlace:
    """Where the loader is: the epoch, and how many of its batches were read."""

    epoch: int = 0
    within: int = 0

    def advance(self, spec: RunSpec) -> None:
        self.within += 1
        if self.within == spec.steps_per_epoch:
            self.epoch, self.within = self.epoch + 1, 0


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes this rank holds of ``tensor`` (a DTensor's shard), detached, same storage."""
    tensor = tensor.detach()
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


class Resumable:
    """A rank's training state that a checkpoint must keep: the parameters and optimiser
    state it steps (its shard, where the strategy shards them), the scheduler, torch's RNG
    and the loader's place."""

    def __init__(self, dp, spec: RunSpec, place: LoaderPlace):
        self.spec = spec
        self.optimizer = getattr(dp.optimizer, "optim", dp.optimizer)  # this rank's own
        self.schedule_on = dp.optimizer  # the optimiser whose lr the loop's scheduler sets
        self.scheduler = make_scheduler(self.schedule_on, spec)
        self.place = place  # the loop's own: a restart moves it, never replaces it
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.first_params = [_local(p).clone() for p in self.params]
        self.first_rng = torch.get_rng_state()

    def _optimizer_tensors(self) -> dict[str, torch.Tensor]:
        found = {}
        for i, p in enumerate(self.params):
            for name, value in sorted(self.optimizer.state.get(p, {}).items()):
                if isinstance(value, torch.Tensor):
                    found[f"{i}/{name}"] = _local(value)
        return found

    def _lrs(self) -> list[float]:
        return [g["lr"] for g in self.schedule_on.param_groups]

    def digests(self) -> tuple[tuple[str, str], ...]:
        tensors = {
            "parameters": [_local(p) for p in self.params],
            "optimizer state": [*self._optimizer_tensors().values(),
                                torch.tensor(self._lrs(), dtype=torch.float64)],
            "scheduler": [torch.tensor([self.scheduler.last_epoch])],
            "RNG state": [torch.get_rng_state()],
            "sampler": [torch.tensor([self.place.epoch, self.place.within])],
        }
        return tuple((part, fingerprint(map(_local, tensors[part]), 0).digest)
                     for part in PARTS)

    def checkpoint(self, rank: int) -> dict[str, torch.Tensor]:
        """The state dict this rank hands DCP, keyed as the knobs say: a key every rank
        shares holds one tensor in the checkpoint (DCP keeps one rank's copy), so what
        differs between ranks needs a key of its own."""
        knobs = self.spec.knobs
        shard = f"rank{rank}/" if knobs.checkpoint_keys == "per-rank" else ""
        own_rng = f"rank{rank}/" if knobs.restored_rng == "per-rank" else ""
        state = {f"{shard}parameters/{i}": _local(p) for i, p in enumerate(self.params)}
        state |= {f"{shard}optimizer/{key}": t for key, t in self._optimizer_tensors().items()}
        state["optimizer/lr"] = torch.tensor(self._lrs(), dtype=torch.float64)
        if knobs.restore_scheduler:
            state["scheduler/last_epoch"] = torch.tensor([self.scheduler.last_epoch])
        state[f"{own_rng}rng"] = torch.get_rng_state()
        if knobs.restored_sampler != "nothing":
            state["sampler/epoch"] = torch.tensor([self.place.epoch])
        if knobs.restored_sampler == "epoch-and-position":
            state["sampler/within"] = torch.tensor([self.place.within])
        return state

    def forget(self) -> None:
        """Hold what a freshly started process holds before it loads a checkpoint."""
        for p, first in zip(self.params, self.first_params):
            _local(p).copy_(first)
        for tensor in self._optimizer_tensors().values():
            tensor.zero_()  # Adam's state at its first step: zeros, step 0
        for group in self.schedule_on.param_groups:
            group["lr"] = self.spec.learning_rate
            group.pop("initial_lr", None)
        self.scheduler = make_scheduler(self.schedule_on, self.spec)
        torch.set_rng_state(self.first_rng)
        self.place.epoch = self.place.within = 0

    def load(self, state: dict[str, torch.Tensor]) -> None:
        """Read ``state`` (DCP has filled it in place) back into the live objects."""
        if "optimizer/lr" in state:
            for group, lr in zip(self.schedule_on.param_groups, state["optimizer/lr"].tolist()):
                group["lr"] = lr
                group["initial_lr"] = self.spec.learning_rate
        if "scheduler/last_epoch" in state:
            saved = self.scheduler.state_dict()
            saved["last_epoch"] = int(state["scheduler/last_epoch"])
            saved["_last_lr"] = self._lrs()
            self.scheduler.load_state_dict(saved)
        rng = [v for k, v in state.items() if k.endswith("rng")]
        if rng:
            torch.set_rng_state(rng[0])
        self.place.epoch = int(state.get("sampler/epoch", torch.tensor([0])))
        self.place.within = int(state.get("sampler/within", torch.tensor([0])))


def restart(resumable: Resumable, rank: int, step: int) -> RestartEvidence:
    """Save, forget, load: one restart after ``step``, with what it read back."""
    saved, place_saved = resumable.digests(), (resumable.place.epoch, resumable.place.within)
    schedule_saved = resumable.scheduler.last_epoch
    shared = [tempfile.mkdtemp(prefix="distdoctor-checkpoint-") if rank == 0 else ""]
    dist.broadcast_object_list(shared, src=0)  # one folder, rank 0's, for every rank
    folder = str(shared[0])
    try:
        dcp.save(resumable.checkpoint(rank), checkpoint_id=folder)
        resumable.forget()
        state = resumable.checkpoint(rank)  # what DCP loads into: the live parameters and
        # optimiser state in place, fresh tensors for the rest (read back by ``load``)
        if resumable.spec.knobs.restored_optimizer == "rank-0" and rank != 0:
            state = {k: v for k, v in state.items() if "optimizer/" not in k}  # not loaded
        dcp.load(state, checkpoint_id=folder)
        resumable.load(state)
        dist.barrier()
    finally:
        if rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
    return RestartEvidence(step=step, saved=saved, restored=resumable.digests(),
                           sampler_saved=place_saved,
                           sampler_restored=(resumable.place.epoch, resumable.place.within),
                           scheduler_saved=schedule_saved,
                           scheduler_restored=resumable.scheduler.last_epoch)
