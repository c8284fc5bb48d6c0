"""A rank's training state does not fit the memory it has: out of memory at the first step."""

from distdoctor.faults import Fault, Variant

FAULT = Fault(
    id="over-memory-budget",
    title="Out of memory at the first step",
    strategies=("zero1",),
    symptom="at the first optimiser step a rank's parameters, gradients and optimiser state "
            "exceed the memory it has, and it stops with out-of-memory",
    cause="the ZeRO stage, on this many ranks, keeps more state per rank than fits: each "
          "stage shards only some of the states (ZeRO-1 the optimiser's, ZeRO-2 the "
          "gradients' too, ZeRO-3 the parameters' too), so the budget decides the stage",
    fix="move to the lowest ZeRO stage, or else the fewest ranks, at which the planner puts "
        "every rank's state within the budget",
    variants=(Variant("8-bytes-per-param", "each rank may hold 8 bytes per model parameter, "
                      "half of what fp32 Adam keeps unsharded (16)",
                      {"knobs.memory_budget": 8.0}),),
    excluded={
        "zero2": "this budget fits ZeRO-2 on 4 ranks (its fix when run on 2), so the matrix "
                 "shows it on ZeRO-1; a budget is relative: any stage can miss one",
        "zero3": "ZeRO-3 on this model gathers a layer holding 60% of the parameters, so it "
                 "holds more than ZeRO-2 at the same world size",
        **dict.fromkeys(("ddp", "torch-ddp"), "DDP trains with SGD here, which keeps no "
                        "optimiser state: 8 bytes per parameter, exactly this budget"),
        **dict.fromkeys(("torch-zero", "fsdp2", "fsdp2-grad-op"), (
            "torch lays state out its own way (ZeroRedundancyOptimizer by whole tensors, "
            "FSDP2 by padded rows, fsdp2-grad-op with every layer gathered at once), which "
            "the stage formulas the fix relies on describe only roughly; the fault is shown "
            "on the hand-rolled stages, whose bytes match the formulas exactly")),
    },
    reported_as=("over-memory-budget",),
)
