"""Each rank initialises its own model and nothing makes the copies agree."""

from faults import Fault, Variant

FAULT = Fault(
    id="divergent-init",
    title="Ranks diverge from step one",
    strategies=("ddp", "torch-ddp"),
    symptom="the ranks' parameters differ right after the model is built and stay apart, "
            "so every rank trains a different model",
    cause="each rank builds its model from its own random seed and nothing broadcasts "
          "rank 0's parameters",
    fix="broadcast every parameter from rank 0 when the model is wrapped "
        "(dist.broadcast(p, src=0); torch DDP does this at construction)",
    variants=(Variant("own-seed", "each rank seeds its init with seed + rank and skips the "
                      "broadcast", {"knobs.seed_init_per_rank": True,
                                    "knobs.broadcast_params_at_start": False}),),
    masked_by={"torch-ddp": "torch DDP broadcasts rank 0's parameters and buffers when it is "
                            "constructed, so the ranks start identical whatever their seeds"},
)
