"""The built-in data-parallel workload: a small MLP on synthetic data, the strategies that
wrap it (hand-rolled DDP and ZeRO-1/2/3, torch DDP, ZeroRedundancyOptimizer, FSDP2), the
job each rank runs while it records evidence, parameter fingerprints, and the
single-process reference the result is compared with.

It imports ``models`` and ``launch`` (a rank job's context); it is imported by ``pipeline``
(fingerprints) and ``diagnosis`` (which runs it). Nothing here reads a fault or a check.
"""
