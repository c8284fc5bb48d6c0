"""Watching a job's trace directory as its ranks write it (``dirwatch``): which ranks are
in, which stalled, and the wait-for proof over their open calls; read by a rank's own watch
under torchrun and by ``run -- COMMAND`` from outside.
It imports no other family of ``userjob``; ``inrank`` and ``launching`` import it.
"""
