"""``distdoctor attach``: a running job's ranks found, read with py-spy (``pyspy``) and
their Flight Recorder asked, without harming the job (``attach``).
It imports no other family of ``userjob``; ``cli`` imports it.
"""
