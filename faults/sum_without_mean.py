"""Gradients are all-reduced with SUM and never divided by the world size."""

from faults import Fault, Variant

FAULT = Fault(
    id="sum-without-mean",
    title="LR breaks when N changes",
    strategies=("ddp", "torch-ddp", "zero1", "zero2", "zero3",
                "torch-zero", "fsdp2", "fsdp2-grad-op"),
    symptom="the applied gradient is N times the average, so the effective learning rate "
            "grows with the number of ranks and training leaves the single-process path",
    cause="gradients are all-reduced with SUM and not divided by the world size",
    fix="divide the all-reduced gradient by world_size (or all-reduce with AVG)",
    variants=(Variant("sum", "all-reduce SUM with no division",
                      {"knobs.average_gradients": False}),),
)
