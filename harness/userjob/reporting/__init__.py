"""From what a user's job left to what the user reads: traces loaded (``traces``), the
RunRecord built and every check run (``record``), and the one cause first, with ranks,
lines and the fix, as text, JSON and HTML (``report``, stacks as ``stacktext`` prints
them); each process group of a launched command judged alike (``groups``).
It imports no other family of ``userjob``; ``cli``, ``collectives`` and ``testing`` import it.
"""
