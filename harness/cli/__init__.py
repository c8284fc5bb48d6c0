"""The ``distdoctor`` command (also ``python -m distdoctor``): ``main`` builds the parser and
turns bad input into one line and exit code 2; one module per command family (``train``,
``diagnose`` and ``faults``, ``demo``, ``run`` and ``analyze``, ``memory``, ``pipeline``,
``collectives`` and ``check-collective``); ``args`` holds the shared options and
``tables`` the terminal renderings of records and verdicts.

It may import every other package; nothing but ``distdoctor.__main__`` imports it. A command
imports torch only when it trains, so ``--help``, ``faults`` and ``memory`` start fast.
"""
