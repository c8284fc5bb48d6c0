"""Every default deadline, in one table: how long ranks may make no progress before they
count as hung. A deadlock the calls prove is reported at once whatever these are; a
deadline is only for what the calls cannot prove (a rank spinning, a rank gone quiet)."""

# a user's job (run, check-collective, the pytest plugin, the one-process comparison): a
# slow step, a long data load or a compile is never called a hang
USER_JOB_S = 300.0
# a rank under torchrun watching itself (python -m distdoctor.userjob, run -- COMMAND's
# hook) with no process outside to decide for the group: shorter, as a user waits on it
IN_RANK_S = 60.0
# a Flight Recorder dump read without its job: the deadline the record says it had
DUMPED_JOB_S = 60.0
# the built-in workload and the warm pools' jobs: each step takes milliseconds
WORKLOAD_S = 30.0
# a rank's start-up (Python, torch, the tracer, its own imports and init_process_group
# waiting for its peers): ranks on a busy machine take seconds each to import torch, so
# start-up is never judged by a job's short deadline
START_S = 120.0
