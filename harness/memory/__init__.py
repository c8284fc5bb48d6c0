"""Memory per rank for each ZeRO stage: the formulas (``formulas``), what fixes a plan that
does not fit (``planner``) and the ``distdoctor memory`` command (``cli``)."""
