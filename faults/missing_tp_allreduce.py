"""A row-parallel layer's partial outputs are never summed over the tensor-parallel group."""

from distdoctor.faults import Fault, Variant

FAULT = Fault(
    id="missing-tp-allreduce",
    title="Tensor-parallel ranks train on partial sums",
    strategies=("tp", "torch-tp", "tp-dp"),
    symptom="the ranks of a tensor-parallel group disagree on a row-parallel layer's output "
            "from the first forward: each carries on with its own partial sum, and training "
            "runs without an error, on the wrong model",
    cause="the row-parallel layer's partial outputs are never all-reduced over the "
          "tensor-parallel group (a forgotten reduce, or a plan that leaves the output "
          "Partial and takes it local)",
    fix="all-reduce the row-parallel layer's output over the tensor-parallel group "
        "(Megatron's reduce_from_tensor_model_parallel_region; with parallelize_module, "
        "RowwiseParallel with output_layouts=Replicate(), its default)",
    variants=(Variant("no-allreduce", "fc2 hands each rank its own partial sum",
                      {"knobs.tp_output_allreduce": False}),),
    reported_as=("missing-tp-allreduce",),
)
