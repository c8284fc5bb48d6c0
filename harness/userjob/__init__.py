"""``distdoctor run`` and ``distdoctor analyze``: a user's own, unchanged script on N ranks.
``launcher`` starts it as ``torchrun --standalone`` would, ``bootstrap`` is what runs inside
each rank (``python -m distdoctor.userjob``: the tracer installed, the script run as
``__main__``), and ``report`` folds the checks' findings into the one cause a user reads,
with ranks, file:line and the fix.

It imports ``launch``, ``trace``, ``models`` and ``checks``; it is imported by ``cli`` and by
``collectives`` (check-collective names the user's raising line the same way).
"""
