"""Some parameters take no part in the loss, and data parallelism is not told."""

from distdoctor.faults import Fault, Variant

FAULT = Fault(
    id="unused-params",
    title="Allreduce deadlocks",
    strategies=("ddp", "torch-ddp", "zero1", "zero2", "torch-zero"),
    symptom="the gradient all-reduce hangs, errors (torch DDP: 'Expected to have finished "
            "reduction in the prior iteration' at step 2, with parameter indices only) or "
            "silently leaves gradients un-averaged at step 1",
    cause="some parameters got no gradient (their branch was skipped), so a rank has "
          "nothing to contribute for them and the ranks' gradient syncs no longer match",
    fix="find_unused_parameters=True, so missing gradients are reduced as zeros "
        "(or make every rank use every parameter)",
    variants=(
        Variant("some-ranks", "odd ranks skip the aux head", {"knobs.aux_skipped_on": "odd-ranks"}),
        Variant("all-ranks", "every rank skips the aux head",
                {"knobs.aux_skipped_on": "all-ranks"}),
    ),
    excluded=dict.fromkeys(("zero3", "fsdp2", "fsdp2-grad-op"), (
        "sharded parameters are gathered layer by layer as each layer's forward runs, so a "
        "layer some ranks skip leaves the ranks' all-gathers mismatched in the forward pass, "
        "before any gradient exists (a collective mismatch, which the hang and collective "
        "checks report), and a layer every rank skips simply gets no gradient anywhere, "
        "which sharded training handles")),
    reported_as=("unused-params",),
)
