"""Gradients are all-reduced with SUM and never divided by the world size."""

from distdoctor.faults import Fault, Variant
from distdoctor.models.strategies import DATA_PARALLEL

FAULT = Fault(
    id="sum-without-mean",
    title="LR breaks when N changes",
    strategies=DATA_PARALLEL,
    symptom="the applied gradient is N times the average, so the effective learning rate "
            "grows with the number of ranks and training leaves the single-process path",
    cause="gradients are all-reduced with SUM and not divided by the world size",
    fix="divide the all-reduced gradient by world_size (or all-reduce with AVG)",
    variants=(Variant("sum", "all-reduce SUM with no division",
                      {"knobs.average_gradients": False}),),
    reported_as=("sum-without-mean",),
)
