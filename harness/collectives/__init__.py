"""Collectives from scratch: transports, algorithms, the jobs that run them on ranks.

Names live here, free of torch imports, so the command line can list them cheaply.
"""

OPS = ("sum", "avg", "max", "min", "product")
KINDS = ("allreduce", "broadcast", "allgather", "reduce_scatter")
