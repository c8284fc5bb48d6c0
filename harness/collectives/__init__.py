"""Collectives from scratch: transports, algorithms, the jobs that run them on ranks.

Names live here, free of torch imports, so the command line can list them cheaply.
``checker`` is ``distdoctor check-collective``: the same properties, run on a user's own
implementation.

It imports ``launch`` (warm pools) and ``doctor`` (the user's raising line, found as
``distdoctor run`` finds it); only ``cli`` imports it.
"""

OPS = ("sum", "avg", "max", "min", "product")
KINDS = ("allreduce", "broadcast", "allgather", "reduce_scatter")
# what a user's collective may call (check-collective lists it in --help, and a call that
# does not fit these signatures fails at once with them)
USER_API = (
    ("send(tensor, dst)", "returns once sent (on the rendezvous wire: once received)"),
    ("recv(src) -> tensor", "the next tensor from rank src, in the sender's shape and dtype"),
    ("isend(tensor, dst) -> handle", "returns at once; handle.wait() returns once sent"),
    ("exchange(tensor, dst, src) -> tensor", "sends to dst while receiving from src (the "
     "received tensor has the sent one's shape and dtype): a ring step that cannot deadlock"),
    ("rank, world_size", "this rank, and how many ranks there are"),
)
