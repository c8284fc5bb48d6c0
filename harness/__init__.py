"""distdoctor: finds, explains and fixes bugs in distributed PyTorch training.

Everything installed lives under this one name: this folder (``harness/`` in the
repository) is ``distdoctor``, and the repository's ``checks/`` and ``faults/`` are
``distdoctor.checks`` and ``distdoctor.faults``, so nothing collides with a user's own
packages. One package per stage of a run's flow; each imports only the packages named on
its ``imports:`` line (``tests/test_layout.py`` holds the same table and fails on any other
edge, and on any import circle):

- ``models``: the records, plain frozen data (RunSpec, Evidence, RunRecord, Finding,
  Verdict), the call vocabulary, the events' names, strategy names, the default deadlines,
  the JSON codec.
  imports: nothing
- ``analysis``: algorithms over the records: the wait-for proof, sequence matching, the
  straggler statistics, replica groups, distances, per-step times.
  imports: models
- ``text``: page width, wrapping, how a run's ranks ended, for whatever prints.
  imports: models
- ``faults``: the failure modes, one module each; a fault flips RunSpec knobs only.
  imports: models
- ``memory``: bytes per rank per ZeRO stage, the planner, measured against formula.
  imports: models, text
- ``checks``: the detectors, one module each; they read a RunRecord's evidence only.
  imports: models, analysis, memory, faults
- ``dumps``: torch's Flight Recorder, all of it: a live rank's recorder asked, dumps from
  any job read as plain data into the evidence the checks judge.
  imports: models, analysis
- ``trace``: the in-rank collective tracer and recorders, and folding a trace into Evidence.
  imports: models, analysis, dumps
- ``launch``: forked rank processes, warm pools, the watch that declares hangs, stacks.
  imports: models, analysis, dumps, trace
- ``training``: the built-in data-parallel workload and its strategies (DDP, ZeRO, FSDP2).
  imports: models, analysis, trace, launch
- ``tensor``: tensor-parallel layers and the tensor-parallel workload.
  imports: models, training
- ``pipeline``: the pipeline workload, schedules, simulators, hand-rolled and torch runs.
  imports: models, analysis, text, launch, training
- ``userjob``: a user's own job: ``distdoctor run`` and ``analyze``, traced, and its report.
  imports: models, analysis, dumps, trace, launch, checks
- ``collectives``: collectives from scratch, their transports, and ``check-collective``.
  imports: models, analysis, trace, launch, userjob
- ``faultloop``: on the built-in workloads, run a spec and assess it; inject a fault, apply
  the findings' fix, verify.
  imports: models, analysis, trace, launch, training, tensor, pipeline, checks, faults
- ``fixing``: a user's script patched for a cause (libcst edits), verified by a re-run.
  imports: nothing
- ``teaching``: the exercises (a buggy script each, its task, its fix, the wrong fixes) and
  the grading of a student's attempt on real ranks (a timing alarm put to the vote of a
  second run: analysis, checks).
  imports: models, analysis, launch, userjob, checks
- ``testing``: the pytest plugin and the helpers that test a user's code on warm ranks.
  imports: models, analysis, trace, launch, userjob, fixing
- ``pictures``: the HTML reports: charts, timelines, the wait-for graph, Gantt charts.
  imports: models, analysis, memory, pipeline
- ``cli``: the ``distdoctor`` command, one module per command family.
  imports: models, analysis, text, faults, memory, checks, dumps, trace, launch, pipeline,
  userjob, collectives, faultloop, fixing, teaching, pictures
"""
