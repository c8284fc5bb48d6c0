"""The recorders of the silent bugs' evidence, installed together: what ``distdoctor run``
records of a user's script, and what a pool that checks users' training records."""

from __future__ import annotations


def install_recorders(tracer) -> None:
    """Batches, gradients (and a GradScaler's unscaling), DDP's buffers, non-finite
    values, optimisers' settings and state, the training state's bytes (under a memory
    budget only), a tensor-parallel model's shared tensors, a pipeline's stage times,
    where each step's time goes: hooks that stay for the life of the process."""
    from distdoctor.trace.batches import record_batches
    from distdoctor.trace.buffers import record_buffers
    from distdoctor.trace.clearing import record_clearing
    from distdoctor.trace.gradients import record_gradients
    from distdoctor.trace.memory import record_memory
    from distdoctor.trace.nonfinite import record_nonfinite
    from distdoctor.trace.optimizer import record_optimizer
    from distdoctor.trace.phases import record_phases
    from distdoctor.trace.pipelining import record_pipeline_stages
    from distdoctor.trace.resume import record_resume
    from distdoctor.trace.tensorparallel import record_tensor_parallel

    record_batches(tracer)
    record_buffers(tracer)
    record_clearing(tracer)
    record_gradients(tracer)
    record_nonfinite(tracer)
    record_optimizer(tracer)
    record_memory(tracer)  # (only under a memory budget)
    record_tensor_parallel(tracer)
    record_pipeline_stages(tracer)
    record_phases(tracer)
    record_resume(tracer)  # (only under resume-check)
