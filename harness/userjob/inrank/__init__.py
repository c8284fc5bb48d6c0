"""What runs inside each rank of a user's job: ``bootstrap`` (``python -m
distdoctor.userjob``: the tracer installed, the script run as ``__main__``, a rank watching
its own group under torchrun) and ``autohook`` (the same, installed from a sitecustomize
into the processes of ``run -- COMMAND`` that become ranks). Imports nothing at package
level: every Python process of a traced command imports this package.
It imports ``watching``; ``launching`` and ``python -m distdoctor.userjob`` import it.
"""
