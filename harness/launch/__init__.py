"""Launching ranks: forked processes with a live process group, warm pools that run job
after job, the watch that declares a hang when no rank makes progress, every rank's stacks,
and reaping on any ending (hang, crash, Ctrl-C, a killed parent).

Only this package and ``doctor`` start processes or form process groups. It imports
``models`` (how a rank ended) and ``trace`` (a rank installs the tracer when asked); it is
imported by ``training`` and ``pipeline`` (their rank jobs get a RankContext), ``doctor``,
``collectives``, ``diagnosis`` and ``cli``.
"""
