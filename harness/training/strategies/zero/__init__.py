"""Hand-rolled ZeRO: stages 1 and 2 (``stage12``) and 3 (``stage3``) over one flat layout.

Every stage shares ``layout``: each layer's parameters as one flat buffer, zero-padded to
a multiple of the world size and cut into equal shards, so one collective moves a layer
and every rank's shard has the same size.
"""
