"""Failure modes: one module per fault, each flipping RunSpec knobs and nothing else."""
