"""``distdoctor run``, ``attach`` and ``analyze``: a user's own, unchanged script on N ranks,
one module family per job:

- ``launching``: starting the ranks (``run SCRIPT``) or any launcher's command
  (``run -- COMMAND``), their output passed on;
- ``inrank``: what runs inside each rank (``python -m distdoctor.userjob``: the tracer
  installed, the script run as ``__main__``; or the same hooked into a command's ranks);
- ``watching``: a trace directory watched as ranks write it, stalls and the wait-for proof;
- ``attaching``: a running job read from outside (py-spy, Flight Recorder);
- ``reporting``: the traces folded into the one cause a user reads, with ranks, file:line
  and the fix;
- ``resuming``: resume-check's three runs of a script (stopped after a checkpoint, once
  through, resumed) and their comparison.

Within it, ``launching`` imports ``inrank`` and ``watching``, ``inrank`` imports
``watching``, ``resuming`` imports ``launching`` and ``reporting``, and no family imports
back (tests/test_layout.py holds the same table). It imports
``launch``, ``trace``, ``models`` and ``checks``; it is imported by ``cli`` and by
``collectives`` (check-collective names the user's raising line the same way).
"""
