"""Strategy names, and what a run's spec needs to know of each: its ZeRO stage, its family,
its one-line help.

A RunSpec names its strategy, and the spec (its default optimiser), the faults (where they
apply), the checks (which strategy a memory fix moves a run to) and the command line (what
it offers) need these facts but never the implementations. So the names live here, free of
torch, below everything that reads them; ``distdoctor.training.strategies`` maps the same names
to the classes that implement them. Pipeline strategies are named in ``distdoctor.pipeline``.
"""

from __future__ import annotations

# every data-parallel strategy (each rank trains on its own batch), in the order offered
HELP = {
    "ddp": "hand-rolled DDP (broadcast, all-reduce SUM, divide)",
    "torch-ddp": "torch.nn.parallel.DistributedDataParallel",
    "zero1": "hand-rolled ZeRO-1: optimiser state sharded",
    "zero2": "hand-rolled ZeRO-2: gradients sharded too",
    "zero3": "hand-rolled ZeRO-3: parameters sharded too, gathered layer by layer",
    "torch-zero": "torch ZeroRedundancyOptimizer with DDP (ZeRO-1)",
    "fsdp2": "torch fully_shard, reshard_after_forward=True (ZeRO-3)",
    "fsdp2-grad-op": "torch fully_shard, reshard_after_forward=False (ZeRO-2-like)",
}
DATA_PARALLEL = tuple(HELP)
# the strategy of a record of the user's own script or job (run, analyze, a dump): its
# findings are told in torch's words, not the built-in workload's knobs
USER_SCRIPT = "user-script"

# strategies that shard training state, by ZeRO stage; the rest replicate it (stage 0)
STAGES: dict[str, int] = {"zero1": 1, "zero2": 2, "zero3": 3, "torch-zero": 1,
                          "fsdp2-grad-op": 2, "fsdp2": 3}
SHARDED = tuple(STAGES)
# the same family's strategy for each stage: what a memory fix moves a run to
FAMILIES: tuple[dict[int, str], ...] = (
    {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"},
    {0: "torch-ddp", 1: "torch-zero", 2: "fsdp2-grad-op", 3: "fsdp2"},
)


def stage_of(strategy: str) -> int:
    return STAGES.get(strategy, 0)


def family_of(strategy: str) -> dict[int, str] | None:
    """The strategies of ``strategy``'s family by stage (None for pipelines)."""
    return next((f for f in FAMILIES if strategy in f.values()), None)


# tensor parallelism (every rank of a tensor-parallel group reads the same batch and holds
# a slice of each split layer), with its degree: "tp-dp" is 2-way tensor parallel inside
# each pair of ranks, data parallel across the pairs
TENSOR_HELP = {
    "tp": "hand-rolled Megatron tensor parallelism over every rank (column then row layers)",
    "torch-tp": "torch parallelize_module, ColwiseParallel then RowwiseParallel, every rank",
    "tp-dp": "hand-rolled tensor parallelism in pairs of ranks, data parallel across them",
}
TENSOR_PARALLEL = tuple(TENSOR_HELP)


def tensor_degree(strategy: str, world_size: int) -> int:
    """Ranks in one tensor-parallel group (1: no tensor parallelism)."""
    if strategy == "tp-dp":
        return 2
    return world_size if strategy in TENSOR_PARALLEL else 1

