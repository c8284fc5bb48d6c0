"""The collective tracer: every point-to-point and collective call a rank makes, written as
JSON lines the moment it is entered, waited on and completed, so the call a rank is blocked
in is on record before anyone stops it; and folding what a rank streamed home into its
Evidence.

It imports only ``models``; it is imported by ``launch`` (pool ranks install the tracer),
``doctor`` (a user's script runs under it), ``diagnosis`` and ``cli``.
"""
