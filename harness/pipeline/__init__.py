"""Pipeline parallelism: schedules, simulators, real runs (hand-rolled and torch's).

The strategy names live here, free of torch imports, so the command line can offer them
without paying for torch at start-up.

It imports ``models``, ``launch`` (a rank job's context), ``training`` (fingerprints),
``text``, and ``checks`` (the measured stage times its report prints); it is imported by
``diagnosis``, which runs it, and by ``cli``.
"""

# hand-rolled strategy -> the schedule its ranks walk (distdoctor.pipeline.orders)
HANDROLLED = {"pipe-gpipe": "gpipe", "pipe-1f1b": "1f1b"}
# torch strategy -> (torch.distributed.pipelining schedule class, stages per rank, layout)
TORCH_SCHEDULES = {
    "torch-pipe-gpipe": ("ScheduleGPipe", 1, "loop"),
    "torch-pipe-1f1b": ("Schedule1F1B", 1, "loop"),
    "torch-pipe-interleaved": ("ScheduleInterleaved1F1B", 2, "loop"),
    "torch-pipe-zbv": ("ScheduleZBVZeroBubble", 2, "v"),
    "torch-pipe-dualpipev": ("ScheduleDualPipeV", 2, "v"),
}
PIPELINE_STRATEGIES = tuple(HANDROLLED) + tuple(TORCH_SCHEDULES)
