"""Sharded training resumes with shards that are not the ranks' own."""

from distdoctor.faults import Fault, Variant, restarted

FAULT = Fault(
    id="shards-not-restored",
    title="After a restart the ranks hold the wrong shards",
    strategies=("zero1", "zero2", "zero3", "ddp", "torch-ddp"),
    symptom="after resuming from a checkpoint, ranks hold parameter or optimiser shards "
            "that are not the ones they saved, and the model trains from a mixture",
    cause="every rank saves its own shard under the same key with "
          "torch.distributed.checkpoint, which keeps one copy per key (it takes equal "
          "keys for replicated state), so the other ranks' shards are never written",
    fix="save sharded state as what it is: each rank's shard under a key of its own, or "
        "as a DTensor (fully_shard's state_dict, get_state_dict) so DCP writes every shard",
    variants=(Variant("one-key-for-all", "each rank's shard is saved under the same key",
                      {"knobs.checkpoint_keys": "shared"}),),
    scenario=restarted,
    masked_by=dict.fromkeys(("ddp", "torch-ddp"), (
        "every rank holds the whole model and optimiser, so one copy under a shared key is "
        "every rank's state: nothing is lost")),
    excluded=dict.fromkeys(("torch-zero", "fsdp2", "fsdp2-grad-op"), (
        "the ranks' shards differ in shape there, so DCP refuses the checkpoint (a size "
        "mismatch, or a key it cannot place) instead of resuming silently wrong")),
    reported_as=("params-not-restored",),
)
