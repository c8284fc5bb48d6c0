"""Collectives from scratch: transports, algorithms, the jobs that run them on ranks.

Names live here, free of torch imports, so the command line can list them cheaply.
``checker`` is ``distdoctor check-collective``: the same properties, run on a user's own
implementation.

It imports ``launch`` (warm pools) and ``doctor`` (the user's raising line, found as
``distdoctor run`` finds it); only ``cli`` imports it.
"""

OPS = ("sum", "avg", "max", "min", "product")
KINDS = ("allreduce", "broadcast", "allgather", "reduce_scatter")
