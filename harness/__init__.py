"""distdoctor's harness: everything that starts, drives and watches ranks, and what they run.

One package per stage of a run's flow, each importing only the packages listed before it
(``tests/test_layout.py`` fails on any import circle, module or package):

- ``models``: the data model (RunSpec, Evidence, RunRecord, Finding, Verdict), strategy
  names, distances between fingerprints, the JSON codec. Imports nothing of the project.
- ``text``: page width, wrapping, how a run's ranks ended, for whatever prints.
- ``trace``: the in-rank collective tracer, and folding what a rank streamed into Evidence.
- ``launch``: forked rank processes, warm pools, the watch that declares hangs, stacks, reaping.
- ``memory``: bytes per rank per ZeRO stage, the planner, measured against formula.
- ``training``: the built-in data-parallel workload, its strategies (DDP, ZeRO, FSDP2), the
  rank job and the single-process reference.
- ``pipeline``: the pipeline workload, schedules, simulators, hand-rolled and torch runs.
- ``doctor``: ``distdoctor run`` and ``analyze``: a user's own script, traced, and its report.
- ``collectives``: collectives from scratch, their transports, and ``check-collective``.
- ``diagnosis``: run a spec and assess it; inject a fault, apply the findings' fix, verify.
- ``cli``: the ``distdoctor`` command, one module per command family.

The failure modes (``faults/``) and detectors (``checks/``) sit beside this package: faults
import only ``models``; checks import ``models``, ``memory`` and ``faults`` (for the cause
and fix text), never the training code, so they judge a user's run the same way.
"""
