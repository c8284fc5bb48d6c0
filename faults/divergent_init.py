"""Each rank initialises its own model and nothing makes the copies agree."""

from distdoctor.faults import Fault, Variant

FAULT = Fault(
    id="divergent-init",
    title="Ranks diverge from step one",
    strategies=("ddp", "torch-ddp", "zero1", "zero2", "torch-zero"),
    symptom="the ranks' parameters differ right after the model is built and stay apart, "
            "so every rank trains a different model",
    cause="each rank builds its model from its own random seed and nothing broadcasts "
          "rank 0's parameters",
    fix="broadcast every parameter from rank 0 when the model is wrapped "
        "(dist.broadcast(p, src=0); torch DDP does this at construction)",
    variants=(Variant("own-seed", "each rank seeds its init with seed + rank and skips the "
                      "broadcast", {"knobs.seed_init_per_rank": True,
                                    "knobs.broadcast_params_at_start": False}),),
    masked_by=dict.fromkeys(("torch-ddp", "torch-zero"), (
        "torch DDP broadcasts rank 0's parameters and buffers when it is constructed, so the "
        "ranks start identical whatever their seeds")),
    excluded=dict.fromkeys(("zero3", "fsdp2", "fsdp2-grad-op"), (
        "sharding cuts one model out of the ranks' own inits (each keeps its slice), so "
        "there are no replicas to disagree: every rank trains the same model, a valid "
        "random init that is simply not rank 0's")),
    reported_as=("divergent-parameters",),
)
