"""Memory per rank for each ZeRO stage: the formulas (``formulas``), what fixes a plan that
does not fit (``planner``), and a measured run's bytes against its stage's formula
(``measured``). The ``distdoctor memory`` command that prints them is ``distdoctor.cli.memory``.

It imports ``models`` and ``text``, and no torch; it is imported by ``checks`` (the memory
budget's fix is the planner's cheapest fit) and ``cli``.
"""
