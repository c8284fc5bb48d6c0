"""The exercises, in the order a course takes them: a buggy script each, the task a student
is set, the fix a teacher has in mind and the wrong fixes students make.

The fix and the wrong fixes are edits of the script (text it holds, and what replaces it):
the tests apply each and grade the result on real ranks, so the reference fix is known to
pass and each wrong fix to fail with its reason. A student is never shown them.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from distdoctor.models.verdict import RESUME_CAUSES

# the world sizes a script is graded at: a second one catches a fix that holds only at the
# first (a gradient divided by a constant that happens to equal today's world size)
WORLD_SIZES = (2, 3)
SCRIPT = "train.py"  # the student's copy of an exercise's training script
LAUNCHER = "launch.sh"  # the student's copy of a launch script, where the bug is in it


@dataclass(frozen=True)
class Edit:
    """Replace ``old`` (text the script holds once) with ``new``."""

    old: str
    new: str

    def apply(self, source: str) -> str:
        if source.count(self.old) != 1:
            raise ValueError(f"the script holds {self.old!r} {source.count(self.old)} times, "
                             f"not once")
        return source.replace(self.old, self.new)


@dataclass(frozen=True)
class WrongFix:
    """A fix students make that does not cure the bug, and the kind of cause the grader
    still finds in it (the reason the student is told, in the detector's words)."""

    name: str
    edits: tuple[Edit, ...]
    still: str  # the cause kind the graded run still shows


@dataclass(frozen=True)
class Exercise:
    name: str  # the failure mode: a catalogue fault's id, or a report's cause kind
    title: str
    task: str  # what the student is told: the symptom, never the cause
    script: str  # a file of exercises/
    kinds: tuple[str, ...]  # the cause kinds the buggy script shows
    fix: tuple[Edit, ...]
    wrong_fixes: tuple[WrongFix, ...] = ()
    # graded at these world sizes, the ranks numbered as this many nodes (all on this
    # machine, as torchrun --nnodes numbers them): a mesh laid across nodes needs two
    world_sizes: tuple[int, ...] = WORLD_SIZES
    nodes: int = 1
    # bytes of training state each rank may hold, as a device's memory would allow (0: not
    # measured): its ranks are graded under ``distdoctor run --memory-budget``
    memory_budget: int = 0
    # bytes of optimiser state per parameter element the task keeps over all ranks, where
    # it bounds memory (Adam's two fp32 moments: 8): a fix may hold it elsewhere, not drop it
    state_per_parameter: float = 0.0
    # a training script of exercises/ written beside ``script`` as train.py, where the bug
    # is in how the nodes are started: ``script`` is then a launch script (LAUNCHER) the
    # student edits, run as ``distdoctor run -- sh launch.sh`` runs it
    program: str = ""
    # nn.Dropout layers of its parallelized model the task keeps dropping (p > 0, in
    # training): a fix may change how they draw, not remove them
    dropouts: int = 0

    @property
    def edited(self) -> str:
        """The file the student is given to fix."""
        return LAUNCHER if self.program else SCRIPT

    def ranks(self, *world_sizes: int) -> str:
        """"4 gloo ranks", how they are numbered where they stand for several nodes, and the
        memory each may hold where the exercise bounds it."""
        said = f"{' and '.join(map(str, world_sizes))} gloo ranks"
        if self.program:
            return (f"{said}, started by {LAUNCHER} as it starts them, its nodes all on this "
                    f"machine (as distdoctor run -- sh {LAUNCHER} runs it; PORT is a free "
                    f"port, torchrun the one beside distdoctor)")
        if self.nodes > 1:
            said += (f", numbered as {self.nodes} nodes' (as torchrun --nnodes {self.nodes} "
                     f"does)")
        if self.memory_budget:
            said += (f", each measuring its training state against {self.memory_budget} "
                     f"bytes, as a device's memory would bound it (distdoctor run "
                     f"--memory-budget {self.memory_budget})")
        return said

    def source(self) -> str:
        return resources.files(__package__).joinpath("exercises", self.script).read_text()

    def program_source(self) -> str:
        return resources.files(__package__).joinpath("exercises", self.program).read_text()

    @property
    def resumes(self) -> bool:
        """Is the bug in how the script resumes? Then resume-check grades it (stopped after
        a checkpoint, run through, resumed), not a run alone."""
        return set(self.kinds) <= set(RESUME_CAUSES)


def _sampler(arguments: str, epoch: str) -> tuple[Edit, ...]:
    """shared_shuffle_seed.py with a DistributedSampler (given ``arguments``) told
    ``epoch`` each epoch: the fix, and the wrong fixes that differ from it in one place."""
    return (Edit("from torch.utils.data import DataLoader, TensorDataset",
                 "from torch.utils.data import DataLoader, DistributedSampler, TensorDataset"),
            Edit("loader = DataLoader(data, batch_size=8, shuffle=True)",
                 f"sampler = DistributedSampler(data, shuffle=True{arguments})\n"
                 "loader = DataLoader(data, batch_size=8, sampler=sampler)"),
            Edit("for epoch in range(2):\n",
                 f"for epoch in range(2):\n    sampler.set_epoch({epoch})\n"))


# rng_state_not_restored.py's checkpoint, saved by rank 0 alone, and by every rank
_SAVED_ON_RANK_0 = (
    '    if rank == 0:\n'
    '        torch.save({"model": model.module.state_dict(), "optimizer": '
    'optimizer.state_dict(),\n'
    '                    "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state(),\n'
    '                    "epoch": epoch}, path)\n')
_SAVED_ON_EVERY_RANK = (
    '    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),\n'
    '                "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state(),\n'
    '                "epoch": epoch}, path)\n')

# tp_dropout_rng.py's dropout on the hidden layer, each rank's slice of it, drawn from an
# RNG state of that rank's own (Megatron's model-parallel state); the rest from one seed
_OWN_DROPOUT = '''class OwnDropout(nn.Dropout):
    """Dropout drawn from an RNG state of this rank's own: for an activation each rank
    holds a slice of."""

    def __init__(self, p: float, seed: int) -> None:
        super().__init__(p)
        self.state = torch.Generator().manual_seed(seed).get_state()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self.state)
            out = super().forward(x)
            self.state = torch.get_rng_state()
        return out
'''
_ONE_SEED = Edit("torch.manual_seed(1 + rank)  # as in our DDP recipe: each replica draws its "
                 "own dropout\n",
                 "torch.manual_seed(1)  # one activation on every rank: one dropout mask\n")

COURSE: tuple[Exercise, ...] = (
    Exercise(
        "divergent-init", "Ranks diverge from step one",
        "Every rank is meant to train one and the same model, but the ranks' parameters "
        "differ from the first step on. Find out why, and fix it so that they agree.",
        "divergent_init.py", ("divergent-parameters",),
        (Edit("optimizer = torch.optim.SGD(",
              "for p in model.parameters():\n    dist.broadcast(p.data, src=0)\n"
              "optimizer = torch.optim.SGD("),)),
    Exercise(
        "shared-shuffle-seed", "All ranks see the same batches",
        "With N ranks this job should get through an epoch N times faster, yet every rank "
        "trains on the same samples. Fix it so that each sample is read once per epoch by "
        "one rank, in a new order each epoch.",
        "shared_shuffle_seed.py", ("duplicate-samples",),
        _sampler("", "epoch"),
        (WrongFix("set_epoch with a constant", _sampler("", "0"), "repeated-epoch-order"),
         WrongFix("the sampler seeded by rank", _sampler(", seed=dist.get_rank()", "epoch"),
                  "duplicate-samples"))),
    Exercise(
        "unused-params", "The job dies at its first backward",
        "The job stops at the first backward pass on every rank but rank 0. Find out why, "
        "and fix it so that it trains on every rank.",
        "unused_params.py", ("unused-params",),
        (Edit("DistributedDataParallel(Model())",
              "DistributedDataParallel(Model(), find_unused_parameters=True)"),)),
    Exercise(
        "sum-without-mean", "The learning rate breaks when the number of ranks changes",
        "The loss scale changes when you change the number of ranks: with more ranks the "
        "steps get larger. Find out why, and fix it so that the step does not depend on "
        "how many ranks there are.",
        "sum_without_mean.py", ("sum-without-mean",),
        (Edit("        dist.all_reduce(p.grad)\n",
              "        dist.all_reduce(p.grad)\n        p.grad /= dist.get_world_size()\n"),),
        (WrongFix("divided by today's world size, a constant", (
            Edit("        dist.all_reduce(p.grad)\n",
                 "        dist.all_reduce(p.grad)\n        p.grad /= 2\n"),),
            "sum-without-mean"),)),
    Exercise(
        "send-before-receive", "Point-to-point hangs",
        "Each rank passes a tensor to its right neighbour and takes one from its left, and "
        "the job hangs. Find out where each rank waits, and fix it for any number of ranks.",
        "send_before_receive.py", ("p2p-cycle",),
        (Edit("dist.send(outgoing, dst=(rank + 1) % world)\n"
              "dist.recv(incoming, src=(rank - 1) % world)\n",
              "if rank % 2 == 0:\n"
              "    dist.send(outgoing, dst=(rank + 1) % world)\n"
              "    dist.recv(incoming, src=(rank - 1) % world)\n"
              "else:\n"
              "    dist.recv(incoming, src=(rank - 1) % world)\n"
              "    dist.send(outgoing, dst=(rank + 1) % world)\n"),)),
    Exercise(
        "unbalanced-stages", "Most pipeline ranks sit idle",
        "The model is trained as a pipeline, one stage per rank, and the stages are cut so "
        "that each holds an equal share of the model. Yet adding ranks barely speeds a step "
        "up, and most ranks spend most of each step waiting for their neighbours. Find out "
        "why, and fix it so that no stage holds the others up, whatever the number of ranks.",
        "unbalanced_stages.py", ("unbalanced-stages",),
        (Edit("import torch\n", "import time\n\nimport torch\n"),
         Edit("    return sum(p.numel() for p in layer.parameters())\n",
              "    sample = torch.randn(MICRO, SEQ, WIDTH)\n"
              "    times = []\n"
              "    for _ in range(5):\n"
              "        start = time.thread_time()\n"
              "        layer(sample).sum().backward()\n"
              "        times.append(time.thread_time() - start)\n"
              "    layer.zero_grad()\n"
              "    return min(times)\n"),
         Edit("bounds = cut(layers, world)\n",
              "bounds = [cut(layers, world)]\n"
              "dist.broadcast_object_list(bounds, src=0)  # every rank cuts where rank 0 does\n"
              "bounds = bounds[0]\n")),
        (WrongFix("a cut by FLOPs", (
            Edit("    return sum(p.numel() for p in layer.parameters())\n",
                 "    from torch.utils.flop_counter import FlopCounterMode\n\n"
                 "    counter = FlopCounterMode(display=False)\n"
                 "    with counter:\n"
                 "        layer(torch.randn(MICRO, SEQ, WIDTH)).sum().backward()\n"
                 "    layer.zero_grad()\n"
                 "    return counter.get_total_flops()\n"),), "unbalanced-stages"),)),
    Exercise(
        "allreduce-every-microbatch", "Gradient accumulation is slow",
        "Each optimiser step accumulates four micro-batches, and the job moves four times "
        "the gradient traffic one step needs. Fix it so that it synchronises once a step.",
        "allreduce_every_microbatch.py", ("allreduce-every-microbatch",),
        (Edit("import torch\n", "import contextlib\n\nimport torch\n"),
         Edit("        loss = model(batch).pow(2).mean() / 4\n        loss.backward()\n",
              "        with model.no_sync() if micro < 3 else contextlib.nullcontext():\n"
              "            loss = model(batch).pow(2).mean() / 4\n"
              "            loss.backward()\n")),
        (WrongFix("no_sync() around the last micro-batch instead of the others", (
            Edit("import torch\n", "import contextlib\n\nimport torch\n"),
            Edit("        loss = model(batch).pow(2).mean() / 4\n        loss.backward()\n",
                 "        with model.no_sync() if micro == 3 else contextlib.nullcontext():\n"
                 "            loss = model(batch).pow(2).mean() / 4\n"
                 "            loss.backward()\n")), "unsynced-microbatches"),)),
    Exercise(
        "cleared-microbatches", "Accumulation that learns like one micro-batch",
        "Each optimiser step accumulates four micro-batches, so that a step sees four "
        "times the batch the memory allows. Yet training is as noisy as with one "
        "micro-batch, and the loss falls four times more slowly than the team's notes "
        "say it should. Find out why, and fix it so that each step applies the gradient "
        "of all four micro-batches.",
        "cleared_microbatches.py", ("cleared-microbatches",),
        (Edit("for step in range(4):\n    for micro in range(4):\n        optimizer.zero_grad()\n",
              "for step in range(4):\n    optimizer.zero_grad()\n    for micro in range(4):\n"),),
        (WrongFix("zero_grad() moved after the micro-batches, just before the step", (
            Edit("    for micro in range(4):\n        optimizer.zero_grad()\n",
                 "    for micro in range(4):\n"),
            Edit("    optimizer.step()\n", "    optimizer.zero_grad()\n    optimizer.step()\n")),
            "cleared-microbatches"),)),
    Exercise(
        "collective-mismatch", "A metric only one rank reduces",
        "The job hangs at step 1. Find out which rank waits in which call, and fix it so "
        "that the metric is still printed by rank 0.",
        "collective_mismatch.py", ("collective-mismatch",),
        (Edit("    if rank == 0 and step == 1:\n        metric = torch.ones(1)\n"
              "        dist.all_reduce(metric)\n",
              "    if step == 1:\n        metric = torch.ones(1)\n"
              "        dist.all_reduce(metric)\n    if rank == 0 and step == 1:\n"),),
        (WrongFix("barrier() on every rank while the all-reduce stays on one", (
            Edit("    if rank == 0 and step == 1:\n",
                 "    dist.barrier()\n    if rank == 0 and step == 1:\n"),),
            "collective-mismatch"),)),
    Exercise(
        "world-size-mismatch", "The job never gets past its start",
        "Started with torchrun, the job waits forever: no rank prints its mean, and nothing "
        "fails for half an hour. Find out why, and fix it so that the job runs on however "
        "many ranks it is started with.",
        "world_size_mismatch.py", ("world-size-mismatch",),
        (Edit('world_size=CLUSTER["world_size"])', 'world_size=int(os.environ["WORLD_SIZE"]))'),),
        (WrongFix("the config's world size set to today's number of ranks", (
            Edit('"world_size": 8}', '"world_size": 2}'),), "world-size-mismatch"),)),
    Exercise(
        "rendezvous-mismatch", "torchrun never starts the ranks",
        "The job runs on two nodes, each started by launch.sh's start_node as its machine "
        "would start it (here both nodes are this machine). Neither node ever starts a "
        "rank: torchrun waits ten minutes and gives up. Find out why, and fix launch.sh so "
        "that the two nodes start one job of two ranks.",
        "rendezvous_mismatch.sh", ("rendezvous-mismatch",),
        (Edit('PORT=${PORT:-29400}\n',
              'PORT=${PORT:-29400}\nRUN_ID="run-$(date +%s%N)"  # one id for this run, '
              'on every node\n'),
         Edit('--rdzv-id "run-$(date +%s%N)"', '--rdzv-id "$RUN_ID"')),
        (WrongFix("a longer join timeout (the nodes never meet, however long they wait)", (
            Edit("--rdzv-backend c10d \\\n",
                 "--rdzv-backend c10d --rdzv-conf join_timeout=1200 \\\n"),),
            "rendezvous-mismatch"),
         WrongFix("--nnodes 1 on each node (each node then trains alone)", (
             Edit("--nnodes 2", "--nnodes 1"),), "not-one-job")),
        world_sizes=(2,), program="rendezvous_mismatch.py"),
    Exercise(
        "missing-tp-allreduce", "Tensor-parallel ranks disagree on the output",
        "The model is cut across the ranks with tensor parallelism. Nothing fails and the "
        "loss goes down, yet the ranks print different losses for the same batch. Find out "
        "why, and fix it so that every rank computes the output the whole model would.",
        "missing_tp_allreduce.py", ("missing-tp-allreduce",),
        (Edit("from torch.distributed.tensor import Partial\n", ""),
         Edit('"2": RowwiseParallel(output_layouts=Partial()),', '"2": RowwiseParallel(),'))),
    Exercise(
        "tp-batches-differ", "Tensor-parallel ranks learn from different data",
        "The model is cut across the ranks with tensor parallelism, and the data loader "
        "comes from the team's DDP recipe. Nothing fails, yet each rank prints its own loss "
        "for what should be one model's step. Find out why, and fix it so that the ranks of "
        "one model compute on one batch, while the data stays dealt out between the "
        "data-parallel replicas to come.",
        "tp_batches_differ.py", ("tp-batches-differ",),
        (Edit("sampler = DistributedSampler(data, shuffle=True)  # as in our DDP recipe\n",
              'sampler = DistributedSampler(data, num_replicas=mesh["dp"].size(),\n'
              '                             rank=mesh["dp"].get_local_rank(), shuffle=True)\n'),),
        (WrongFix("the sampler given one seed on every rank", (
            Edit("DistributedSampler(data, shuffle=True)", "DistributedSampler(data, "
                 "shuffle=True, seed=1234)"),), "tp-batches-differ"),)),
    Exercise(
        "tp-across-nodes", "Tensor parallelism over the slow link",
        "The model is cut across pairs of ranks with tensor parallelism, and the pairs "
        "train as data-parallel replicas, on two nodes of two ranks each. On one node it "
        "runs fine; on two, every step waits on the network between the nodes, though "
        "only the gradient average should cross it, once a step. Find out why, and fix it "
        "so that each tensor-parallel pair runs inside one node.",
        "tp_across_nodes.py", ("tp-across-nodes",),
        (Edit('(2, dist.get_world_size() // 2), mesh_dim_names=("tp", "dp")',
              '(dist.get_world_size() // 2, 2), mesh_dim_names=("dp", "tp")'),),
        world_sizes=(4,), nodes=2),
    Exercise(
        "tp-dropout-rng", "Tensor-parallel ranks disagree once dropout is on",
        "The model is cut across the ranks with tensor parallelism and every rank is handed "
        "the same batch. Evaluated without dropout, the ranks agree; in training each prints "
        "its own loss for the same batch. Find out why, and fix it so that the ranks compute "
        "one output, dropout included, as the whole model on one process would (there, "
        "each value of a layer is dropped independently of every other), keeping every "
        "dropout layer.",
        "tp_dropout_rng.py", ("tp-dropout-rng",),
        (Edit("class Block(nn.Module):\n", _OWN_DROPOUT + "\n\nclass Block(nn.Module):\n"),
         Edit("self.drop_hidden, self.drop = nn.Dropout(0.1), nn.Dropout(0.1)",
              "self.drop_hidden = OwnDropout(0.1, seed=100 + dist.get_rank())\n"
              "        self.drop = nn.Dropout(0.1)"),
         _ONE_SEED),
        (WrongFix("the batch broadcast from rank 0 (it was the same on every rank already)", (
            Edit("    batch = data[step * 16:(step + 1) * 16]\n",
                 "    batch = data[step * 16:(step + 1) * 16].clone()\n"
                 "    dist.broadcast(batch, src=0)\n"),), "tp-dropout-rng"),
         WrongFix("one seed on every rank (each slice of the hidden layer then gets the same "
                  "mask)", (_ONE_SEED,), "tp-dropout-rng"),
         WrongFix("dropout removed from the blocks' outputs (the ranks agree without it)", (
             Edit("self.drop_hidden, self.drop = nn.Dropout(0.1), nn.Dropout(0.1)",
                  "self.drop_hidden, self.drop = nn.Dropout(0.1), nn.Identity()"),),
             "dropout-removed")),
        dropouts=4),
    Exercise(
        "replicated-param-drift", "Copies of a layer drift apart",
        "Every rank holds the last layer whole, and the copies start equal, but after a few "
        "steps they no longer agree. Find out why, and fix it so that the copies stay one.",
        "replicated_param_drift.py", ("replicated-param-drift",),
        (Edit("from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, "
              "parallelize_module\n",
              "from torch.distributed.tensor.parallel import (\n    ColwiseParallel,\n"
              "    RowwiseParallel,\n    SequenceParallel,\n    parallelize_module,\n)\n"),
         Edit('    "2": RowwiseParallel(output_layouts=Shard(0)),\n',
              '    "2": RowwiseParallel(output_layouts=Shard(0)),\n'
              '    "4": SequenceParallel(sequence_dim=0),\n'))),
    Exercise(
        "straggler", "Adding ranks does not make training faster",
        "Each step's compute takes a few milliseconds, yet a step takes ten times that, "
        "and adding ranks does not help: a profile shows most ranks spending most of each "
        "step waiting in the gradient all-reduce. Find out why, and fix it so that no rank "
        "holds the others up, while every step's loss is still sent to the metrics service.",
        "straggler.py", ("straggler",),
        (Edit("import time\n", "import queue\nimport threading\nimport time\n"),
         Edit("service = MetricsService()\n",
              "service = MetricsService()\n"
              "records: queue.Queue = queue.Queue()  # sent by a thread of its own, off the "
              "step\n"
              "sender = threading.Thread(target=lambda: [log_metrics(service, *record)\n"
              "                                          for record in iter(records.get, None)])\n"
              "sender.start()\n"),
         Edit("        log_metrics(service, step, loss)\n",
              "        records.put((step, loss.detach()))\n"),
         Edit("dist.destroy_process_group()\n",
              "records.put(None)  # every record sent before the job ends\n"
              "sender.join()\ndist.destroy_process_group()\n")),
        (WrongFix("barrier() on every rank after rank 0's logging", (
            Edit("        log_metrics(service, step, loss)\n",
                 "        log_metrics(service, step, loss)\n    dist.barrier()\n"),),
            "straggler"),)),
    Exercise(
        "scheduler-not-restored", "A resumed run trains differently",
        "The job checkpoints at the end of each epoch and resumes from its last checkpoint "
        "when restarted. A run that was stopped and resumed ends with another model than one "
        "that never stopped. Find out why, and fix it so that a resumed run trains exactly "
        "like one that never stopped.",
        "scheduler_not_restored.py", ("scheduler-not-restored",),
        (Edit('    optimizer.load_state_dict(saved["optimizer"])\n',
              '    optimizer.load_state_dict(saved["optimizer"])\n'
              '    scheduler.load_state_dict(saved["scheduler"])\n'),
         Edit('"rng": torch.get_rng_state(), "epoch": epoch}, path)',
              '"rng": torch.get_rng_state(), "epoch": epoch,\n'
              '                "scheduler": scheduler.state_dict()}, path)')),
        (WrongFix("the scheduler saved but never loaded", (
            Edit('"rng": torch.get_rng_state(), "epoch": epoch}, path)',
                 '"rng": torch.get_rng_state(), "epoch": epoch,\n'
                 '                "scheduler": scheduler.state_dict()}, path)'),),
            "scheduler-not-restored"),)),
    Exercise(
        "rng-state-not-restored", "A resumed run parts from one that never stopped",
        "The job checkpoints at the end of each epoch and resumes from its last checkpoint "
        "when restarted. Each rank draws its own dropout masks, yet after a resume the "
        "ranks train differently from a run that never stopped. Find out why, and fix it "
        "so that a resumed run trains exactly like one that never stopped.",
        "rng_state_not_restored.py", ("rng-state-not-restored",),
        (Edit('path = "checkpoints/last.pt"', 'path = f"checkpoints/rank{rank}.pt"'),
         Edit(_SAVED_ON_RANK_0, _SAVED_ON_EVERY_RANK)),
        (WrongFix("the RNG state no longer restored", (
            Edit('    torch.set_rng_state(saved["rng"])\n', ""),), "rng-state-not-restored"),)),
    Exercise(
        "optimizer-state-not-restored", "After a resume the ranks no longer agree",
        "The job checkpoints at the end of each epoch and resumes from its last checkpoint "
        "when restarted. A run that was stopped and resumed ends with another model than one "
        "that never stopped, and the ranks' models no longer agree. Find out why, and fix it "
        "so that a resumed run trains exactly like one that never stopped.",
        "optimizer_state_not_restored.py", ("optimizer-state-not-restored",),
        (Edit('    if rank == 0:\n        state["optimizer"] = optimizer.state_dict()\n',
              '    state["optimizer"] = optimizer.state_dict()\n'),)),
    Exercise(
        "sampler-not-restored", "A resumed run reads other batches",
        "The job checkpoints at the end of each epoch and resumes from its last checkpoint "
        "when restarted. After a resume it trains on other batches than a run that never "
        "stopped would at the same step. Find out why, and fix it so that a resumed run "
        "trains exactly like one that never stopped.",
        "sampler_not_restored.py", ("sampler-not-restored",),
        (Edit("    sampler.set_epoch(ran)\n", "    sampler.set_epoch(epoch)\n"),),
        (WrongFix("set_epoch with a constant", (
            Edit("    sampler.set_epoch(ran)\n", "    sampler.set_epoch(0)\n"),),
            "repeated-epoch-order"),)),
    Exercise(
        "shards-not-restored", "A sharded model resumes as another model",
        "The job shards its parameters across the ranks (each rank updates its own slice), "
        "saves a distributed checkpoint every other step, and resumes from the last one "
        "when started again. A run that was stopped and resumed ends with another model "
        "than one that never stopped. Find out why, and fix it so that a resumed run trains "
        "exactly like one that never stopped.",
        "shards_not_restored.py", ("params-not-restored",),
        (Edit('    return {"shard": shard,', '    return {f"shard.rank{rank}": shard,'),)),
    Exercise(
        "over-memory-budget", "Out of memory at the first step",
        "Each rank's device has room for 240 KB of training state (parameters, gradients, "
        "optimiser state), and this job stops with out-of-memory at its first optimiser "
        "step on every rank, however many ranks it runs on. Find out why, and fix it so "
        "that every rank's state fits, still training with Adam on the same batches.",
        "over_memory_budget.py", ("over-memory-budget",),
        (Edit("from torch.nn.parallel import DistributedDataParallel\n",
              "from torch.distributed.optim import ZeroRedundancyOptimizer\n"
              "from torch.nn.parallel import DistributedDataParallel\n"),
         Edit("optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)\n",
              "optimizer = ZeroRedundancyOptimizer(model.parameters(), "
              "optimizer_class=torch.optim.Adam, lr=1e-3)\n")),
        (WrongFix("a smaller batch (activations are not what fills it)", (
            Edit("    batch = data[step * 16:(step + 1) * 16]\n",
                 "    batch = data[step * 8:(step + 1) * 8]\n"),), "over-memory-budget"),
         WrongFix("plain SGD in place of Adam (it fits by keeping no state)", (
             Edit("optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)\n",
                  "optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)\n"),),
             "optimizer-changed")),
        memory_budget=240_000, state_per_parameter=8.0),
)


def exercise(name: str) -> Exercise:
    for found in COURSE:
        if found.name == name:
            return found
    raise KeyError(name)
