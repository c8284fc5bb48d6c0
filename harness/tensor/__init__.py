"""Tensor parallelism written out (Megatron-style), the seed's fourth strategy: each weight
matrix split across the ranks of a tensor-parallel group, which all see the same batch.

``layers`` holds the two conjugate autograd functions and the column- and row-parallel
linear layers built on them (and sequence parallelism's reduce-scatter exit), with a log
of the collectives they issue; ``mlp`` cuts the built-in MLP into them (first layer by
columns, second by rows: one all-reduce forward and one backward per pair);
``attention`` cuts a multi-head attention block by heads; ``steps`` trains the MLP, or
torch's ``parallelize_module`` version, for a few steps on a rank and hands back what the
tests compare with one process; ``train`` is the rank job of the ``tp``, ``torch-tp`` and
``tp-dp`` strategies, and records the evidence the tensor-parallel checks read.

It imports ``training`` (the built-in model and data); ``diagnosis`` imports it.
"""
