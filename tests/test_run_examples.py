"""Every example script through the real ``distdoctor run``: cause, ranks and lines.

Each example marks its bug with a "# BUG" comment; the report must point at the lines a
person would look at. These runs start real processes the way torchrun does, so they
are the slow end of the suite (a few seconds each).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import proctable
import pytest
from sources import line_number, line_of
from torchrun_example import torchrun_example

from distdoctor.launch.ports import free_port

pytestmark = pytest.mark.tier("e2e")

EXAMPLES = Path(__file__).parent.parent / "examples"


def example_line(example: str, text: str) -> str:
    """``example.py:line`` of the first line of an example that holds ``text``."""
    return line_of(EXAMPLES / example, text, base=EXAMPLES)


_RUNS: dict[tuple[str, int, float], tuple] = {}


def run_example(distdoctor, tmp_path, example: str, ranks: int, deadline: float = 30.0):
    """The command's output and JSON report; each (example, ranks, deadline) is run once per
    session, however many tests read it (each run starts fresh interpreters: seconds)."""
    key = (example, ranks, deadline)
    if key not in _RUNS:
        report = tmp_path / "report.json"
        done = distdoctor("run", "--nproc-per-node", str(ranks), "--deadline", str(deadline),
                          "--report", str(report), example)
        _RUNS[key] = done, json.loads(report.read_text())
    return _RUNS[key]


def test_a_clean_script_is_reported_clean(distdoctor, tmp_path):
    done, report = run_example(distdoctor, tmp_path, "clean.py", 2)
    assert done.returncode == 0, done.stdout + done.stderr
    assert report["schema"] == "distdoctor.run.v6"
    assert (report["status"], report["cause"], report["findings"]) == ("ok", None, [])
    assert [r["state"] for r in report["ranks"]] == ["finished", "finished"]
    assert report["ranks"][0]["call"]["op"] == "barrier"
    ran = float(done.stdout.split("the script ran ")[1].split(" s once every rank was up")[0])
    assert ran == pytest.approx(report["wall_s"], abs=0.006)  # what the time measures, said


def test_a_rank_the_backend_aborted_is_explained_after_the_report(distdoctor, tmp_path):
    """gloo aborts a rank whose all-reduce got the wrong size: its 'Fatal Python error' and
    thread dump reach stderr, and the report says what they are."""
    done, report = run_example(distdoctor, tmp_path, "shape_mismatch.py", 2,
                               deadline=DEADLINE)
    assert "Fatal Python error: Aborted" in done.stderr
    aborted = [r["rank"] for r in report["ranks"] if "SIGABRT" in (r["error"] or "")]
    assert aborted and done.stdout.split("\n\nwrote ")[0].splitlines()[-1].startswith(
        f"note: rank {aborted[0]} was aborted (SIGABRT" if len(aborted) == 1 else
        "note: ranks 0, 1 were aborted (SIGABRT")


# Every hang among these is proven from the calls (or ends in an error): the deadline is
# only a bound, never what ends them.
LINE_FIRST = {"eval_on_rank0_through_ddp.py": "# BUG", "fsdp_checkpoint_on_rank0.py": "# BUG",
              "group_on_subset.py": "# BUG", "groups_in_opposite_orders.py": "the loss first",
              "skip_step_on_nonfinite_loss.py": "# BUG",
              "model_width_differs.py": "DistributedDataParallel(torch",
              "fsdp_gather_on_rank0_aborts.py": "# BUG",
              "rank_zero_metric.py": "# BUG"}
# examples where gloo aborts the culprit at whichever of its calls the mismatch reaches
# (and the lines of the culprit's collectives the mismatch can reach)
ABORTS = {"fsdp_gather_on_rank0_aborts.py": (".backward()", "# BUG")}
DEADLINE = 60.0


@pytest.mark.parametrize("example, ranks, kind, culprits, where", [
    ("p2p_cycle.py", 3, "p2p-cycle", [0, 1, 2], {r: "dist.send(" for r in range(3)}),
    ("conditional_collective.py", 2, "collective-mismatch", [0, 1],
     {0: "dist.all_reduce(metrics)", 1: "dist.barrier()"}),
    ("data_ran_out.py", 2, "rank-exited-early", [1], {0: "dist.all_reduce(grad)"}),
    ("rank_exits.py", 3, "rank-exited-early", [1], {0: "dist.all_reduce(", 2: "dist.all_reduce("}),
    ("shape_mismatch.py", 2, "collective-mismatch", [0, 1],
     {r: "dist.all_reduce(" for r in range(2)}),
    ("reduce_op_mismatch.py", 2, "collective-mismatch", [0, 1],
     {r: "dist.all_reduce(" for r in range(2)}),
    ("rank_raises.py", 2, "rank-crashed", [1], {0: "dist.all_reduce("}),
    ("ddp_unused_params.py", 2, "unused-params", [1], {}),
    # rank 1 waits inside DDP's bucket-rebuild broadcast, which only the Flight Recorder
    # sees: rank 0's all-reduce, which rank 1 never makes, is to blame
    ("ddp_log_on_rank0.py", 2, "collective-mismatch", [0], {0: "dist.all_reduce("}),
    # rank 1 waits in DDP's gradient all-reduce: rank 0's barrier is to blame
    ("ddp_barrier_on_rank0.py", 2, "collective-mismatch", [0], {0: "dist.barrier()"}),
    # torch's own collectives parted, by the ranks' Flight Recorders: a validation forward
    # through DDP on rank 0 only (its buffer broadcasts paired with rank 1's next training
    # forward's), and FSDP's all-gathers of a checkpoint gathered on rank 0 only (at 4
    # ranks, against the 3 others' barrier; at 2, two equal sides: both are named)
    ("eval_on_rank0_through_ddp.py", 2, "collective-mismatch", [0], {}),
    ("fsdp_checkpoint_on_rank0.py", 4, "collective-mismatch", [0],
     {r: "# WAIT" for r in (1, 2, 3)}),
    ("fsdp_checkpoint_on_rank0.py", 2, "collective-mismatch", [0, 1], {1: "# WAIT"}),
    # gloo aborts rank 0 on the size mismatch, in calls the tracer never saw: the abort is
    # the mismatch, at rank 0's own line (from its faulthandler dump, innermost first)
    ("fsdp_gather_on_rank0_aborts.py", 2, "collective-mismatch", [0], {}),
    # gloo let rank 0's extra all-reduce through: every rank blocks at the loop's line, and
    # the history of the group's calls names rank 0 (its next call is the others' #2)
    ("rank_zero_metric.py", 2, "collective-mismatch", [0], {0: "# LOOP", 1: "# LOOP"}),
    ("rank_zero_metric.py", 4, "collective-mismatch", [0], {r: "# LOOP" for r in range(4)}),
    # group creation is in the default group's sequence: ranks 0, 1's extra new_group is
    # proven at its line (they then block in the next creation; ranks 2, 3 in it or past
    # it, as the store's timing has it)
    ("group_on_subset.py", 4, "collective-mismatch", [0, 1],
     {0: "everyone = ", 1: "everyone = "}),
    # a cycle of waits over two groups of the same ranks: both ranks, both calls
    ("groups_in_opposite_orders.py", 2, "group-cycle", [0, 1],
     {0: "the loss first", 1: "the metrics first"}),

    # rank 1 alone skips a step's backward on a NaN loss: the guard's line first
    ("skip_step_on_nonfinite_loss.py", 2, "partial-step", [1], {}),
    # DDP refuses a model whose shapes differ by rank: the DDP(...) line
    ("model_width_differs.py", 2, "rank-crashed", [1], {}),
])
def test_each_buggy_example_gets_its_cause_ranks_and_lines(distdoctor, tmp_path, example, ranks,
                                                          kind, culprits, where):
    done, report = run_example(distdoctor, tmp_path, example, ranks, deadline=DEADLINE)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "declared at the deadline" not in done.stdout
    assert report["status"] == "failed"
    assert (report["cause"]["kind"], report["cause"]["ranks"]) == (kind, culprits)
    by_rank = {r["rank"]: r for r in report["ranks"]}
    for rank, text in where.items():
        assert by_rank[rank]["call"]["where"] == example_line(example, text)
    if example in LINE_FIRST:  # the culprit's line comes first under "look at"
        first = re.search(r"look at: (\S+?)(?:,|$)", done.stdout, re.M)
        assert first, done.stdout
        # where gloo aborts a rank is timing: rank 0 of the FSDP gather reaches its BUG line
        # only if its last backward's reduce-scatter ended before rank 1's all-gather
        # arrived; else it aborts in that reduce-scatter (seen twice in suite runs on a
        # fresh clone). Either way its first line is where its own abort's stack stood
        # (read from the abort's stack on stderr, or, when torch's abort handler crashed
        # while printing it, as once in a suite run, from the culprit's collectives the
        # mismatch can reach: its last backward's and the gather's)
        aborted_at = {f"{example}:{n}" for n in
                      re.findall(rf'File ".*/{re.escape(example)}", line (\d+)', done.stderr)}
        reachable = {example_line(example, text) for text in ABORTS.get(example, ())}
        expected = {example_line(example, LINE_FIRST[example])} | (
            aborted_at | reachable if example in ABORTS else set())
        assert first[1] in expected, done.stdout + done.stderr[-4000:]
    # the report follows whatever the script printed itself
    assert f"\ndistdoctor run: FAILED: {kind}" in "\n" + done.stdout
    # a forward whose backward was skipped is no micro-batch of an accumulation
    assert "allreduce-every-microbatch" not in done.stdout


# a group that can never form, proven from what each rank gave init_process_group as soon
# as every rank waits in it (the deadline never comes); a rank that never called it is
# named at the deadline, with where it was instead
STARTUP = [("startup_world_size.py", 60.0, "world-size-mismatch", [0, 1],
            "dist.init_process_group", "for a group of 4 (world_size=4 at "
            "startup_world_size.py:{line}), but 2 ranks were started (WORLD_SIZE=2 as the "
            "launcher set it): ranks 2, 3 never come"),
           ("startup_rank_from_slurm.py", 60.0, "duplicate-rank", [0, 1],
            "dist.init_process_group",
            "ranks 0, 1 both ask for rank 0 (rank=0 at startup_rank_from_slurm.py:{line}, "
            "while the launchers set RANK=0, 1)"),
           ("startup_two_ports.py", 60.0, "split-rendezvous", [0, 1], "dist.init_process_group",
            "rank 1 at 127.0.0.1:29511"),
           ("startup_rank_waits_for_data.py", 2.0, "rank-never-joined", [1], "# BUG",
            "rank 0 waits in init_process_group for rank 1, which never called it: rank 1 was "
            "running <module> at startup_rank_waits_for_data.py:")]


@pytest.mark.parametrize("example, deadline, kind, culprits, marker, says", STARTUP,
                         ids=[s[0] for s in STARTUP])
def test_a_group_that_never_forms_is_named_from_what_each_rank_gave_it(
        distdoctor, tmp_path, example, deadline, kind, culprits, marker, says):
    done, report = run_example(distdoctor, tmp_path, example, 2, deadline=deadline)
    assert done.returncode == 1, done.stdout + done.stderr
    cause = report["cause"]
    assert (cause["kind"], cause["ranks"]) == (kind, culprits), done.stdout
    line = line_number(EXAMPLES / example, marker)
    assert says.format(line=line) in cause["summary"], cause["summary"]
    proven = deadline == DEADLINE  # the proof, not the deadline
    assert ("declared at the deadline" in done.stdout) is not proven, done.stdout
    waiting = [r for r in report["ranks"] if r["rank"] not in culprits or proven]
    assert waiting and all(r["state"] == "blocked" and r["collective"].startswith(
        "init_process_group (waiting for its group to form)") for r in waiting), done.stdout
    if kind != "rank-never-joined":
        assert cause["where"] == f"{example}:{line}", done.stdout


def test_a_start_up_through_init_device_mesh_is_recorded_like_init_process_group(
        distdoctor, tmp_path):
    """init_device_mesh calls init_process_group by the name its module took on import:
    that one is wrapped too, so rank 0 waiting inside it for rank 1 (stuck before it) is
    a start-up, named at the deadline with where rank 1 was."""
    script = Path(__file__).parent / "launched" / "mesh_rank_waits.py"
    report = tmp_path / "r.json"
    done = distdoctor("run", "--nproc-per-node", "2", "--deadline", "2", "--report",
                      str(report), str(script))
    cause = json.loads(report.read_text())["cause"]
    assert (cause["kind"], cause["ranks"]) == ("rank-never-joined", [1]), done.stdout
    stuck = range(line_number(script, "# STUCK"), line_number(script, "time.sleep") + 1)
    said = re.search(r"rank 0 waits in init_process_group for rank 1, which never called "
                     r"it: rank 1 was running <module> at (\S+):(\d+)", cause["summary"])
    assert said and said[1] == str(script) and int(said[2]) in stuck, cause["summary"]


def test_ranks_asking_for_different_backends_are_named_whichever_way_each_ended(
        distdoctor, tmp_path):
    """Rank 1 asks for nccl (it "sees a GPU"), rank 0 for gloo: here rank 1 cannot make
    nccl and raises at once while rank 0 waits in the call (on GPUs, nccl's rank would
    return and hang at its first collective). What each asked for names it, not rank 1's
    crash, and rank 1's own error is still shown."""
    example = "startup_backend_per_rank.py"
    done, report = run_example(distdoctor, tmp_path, example, 2, deadline=DEADLINE)
    assert done.returncode == 1, done.stdout + done.stderr
    cause = report["cause"]
    assert (cause["kind"], cause["ranks"]) == ("backend-mismatch", [0, 1]), done.stdout
    assert "rank 0: gloo; rank 1: nccl" in cause["summary"]
    line = line_number(EXAMPLES / example, "dist.init_process_group(")
    assert cause["where"] == f"{example}:{line}"
    assert [r["state"] for r in report["ranks"]] == ["blocked", "crashed"], done.stdout
    assert "  RuntimeError: Distributed package doesn't have NCCL built in" in done.stdout
    assert "declared at the deadline" not in done.stdout


@pytest.mark.parametrize("example, ranks, kind, culprits, marker, measured", [
    ("epoch_not_set.py", 2, "repeated-epoch-order", [0, 1], "# LOOP",
     {"replayed_epochs": [1, 2], "steps_compared": {"1": 4, "2": 4},
      "sampler": "DistributedSampler"}),
    # a loader (and sampler) made anew each epoch: three objects, one loop over one dataset
    ("loader_per_epoch.py", 2, "repeated-epoch-order", [0, 1], "# LOOP",
     {"replayed_epochs": [1, 2], "steps_compared": {"1": 4, "2": 4},
      "sampler": "DistributedSampler"}),
    ("no_distributed_sampler.py", 2, "duplicate-samples", [0, 1], "# LOOP",
     {"max_overlap_share": 1.0, "overlap_share_per_epoch": {"0": 1.0, "1": 1.0},
      "sampler": "RandomSampler"}),
    ("summed_gradients.py", 3, "sum-without-mean", [0, 1, 2], "dist.all_reduce(p.grad)",
     {"ratio": pytest.approx(3.0, rel=1e-5), "world_size": 3}),
    ("own_seed_no_broadcast.py", 3, "divergent-parameters", [1, 2], "# STEP",
     {"first_divergent_step": 1, "ranks_differing_from_rank_0": [1, 2]}),
    # 161 float32 parameters: 644 bytes a sync, 4 syncs where 1 would do
    ("accumulate_without_no_sync.py", 2, "allreduce-every-microbatch", [0, 1], "# FORWARD",
     {"syncs_per_step": 4, "micro_batches_per_step": 4, "minimum_bytes_per_step": 644,
      "bytes_per_step": 2576, "wasted_share": 0.75}),
    # record 21 of 64, unshuffled over 2 ranks: rank 1's 11th sample, its 3rd batch of 4
    # torch's tensor parallelism: the plan's line is where the fix goes
    ("tp_partial_output.py", 2, "missing-tp-allreduce", [1], "= parallelize_module(",
     {"first_step": 1, "layer": "2", "groups": [[0, 1]]}),
    ("tp_sequence_parallel_head.py", 2, "replicated-param-drift", [1], "= parallelize_module(",
     {"first_step": 1, "parameters": ["4.bias", "4.weight"], "group": [0, 1]}),
    # 2 x 2 mesh, 128 samples dealt 4 ways unshuffled: rank r's first batch is r, r + 4, ...
    ("tp_dp_data_by_global_rank.py", 4, "tp-batches-differ", [1, 3], "# LOOP",
     {"first_step": 1, "layer": "0", "groups": [[0, 1], [2, 3]],
      "first_batches": {"0": list(range(0, 32, 4)), "1": list(range(1, 32, 4))}}),
    # buffers every rank keeps for itself: sampled as each forward begins, after DDP's
    # broadcast when it makes one; alike before step 1 (DDP broadcast them once, built)
    ("batchnorm_buffers_not_broadcast.py", 2, "divergent-buffers", [1], "# FORWARD",
     {"first_step": 2, "buffers": ["1.running_mean", "1.running_var"]}),
    ("nan_in_one_shard.py", 2, "non-finite", [1], "# BACKWARD",
     {"first_step": 3, "origin_ranks": [1], "loss_ranks": [1], "gradient_ranks": [1],
      "reached": {"0": 4}, "params": ["0.bias", "0.weight", "2.bias", "2.weight"]}),
])
def test_silent_bugs_are_named_with_their_numbers_and_the_line(distdoctor, tmp_path, example,
                                                               ranks, kind, culprits, marker,
                                                               measured):
    """Nothing crashes and the loss goes down; the report still names the bug, with the
    line to change. The loaders: 64 samples, batches of 8, 2 ranks: 4 steps an epoch on
    each rank, every sample on both ranks when nothing deals them out. The gradients: an
    all-reduce with SUM on 3 ranks applies 3x the mean of the local gradients. The seeds:
    ranks 1 and 2 built other weights than rank 0, seen before the first step."""
    done, report = run_example(distdoctor, tmp_path, example, ranks)
    assert done.returncode == 1, done.stdout + done.stderr
    assert [c["kind"] for c in report["findings"]] == [kind]
    cause = report["cause"]
    assert (cause["kind"], cause["ranks"]) == (kind, culprits)
    assert cause["where"] == example_line(example, marker)
    assert {k: cause["measured"][k] for k in measured} == measured
    assert [r["state"] for r in report["ranks"]] == ["finished"] * ranks
    assert f"look at: {example_line(example, marker)}" in done.stdout


def test_a_zero_grad_inside_the_micro_batch_loop_is_named_before_the_traffic(distdoctor,
                                                                           tmp_path):
    """zero_grad() before each of 4 micro-batches: every step applies its last alone. It
    was told allreduce-every-microbatch alone, whose fix (no_sync) does not cure it; that
    traffic is still listed, after the cause."""
    example = "zero_grad_per_microbatch.py"
    done, report = run_example(distdoctor, tmp_path, example, 2)
    assert done.returncode == 1, done.stdout
    assert [c["kind"] for c in report["findings"]] == ["cleared-microbatches",
                                                       "allreduce-every-microbatch"]
    cause = report["cause"]
    assert (cause["ranks"], cause["where"]) == ([0, 1], example_line(example, "# BUG"))
    assert {k: cause["measured"][k] for k in ("micro_batches", "applied_micro_batches",
                                              "first_step")} == {
        "micro_batches": 4, "applied_micro_batches": 1, "first_step": 1}
    assert cause["measured"]["steps"] == {"0": [1, 2, 3, 4, 5, 6], "1": [1, 2, 3, 4, 5, 6]}


def test_accumulation_whose_last_micro_batch_is_unsynced_parts_the_ddp_replicas(distdoctor,
                                                                              tmp_path):
    """no_sync() off by one (the sync on the first of 4 micro-batches): the cause, then the
    replicas parting, judged as replicas because one DDP wraps them, though each applied
    its own gradient; the healthy version (accumulate_with_no_sync.py) is OK."""
    done, report = run_example(distdoctor, tmp_path, "accumulate_sync_on_first.py", 2)
    assert done.returncode == 1, done.stdout
    assert [c["kind"] for c in report["findings"]] == ["unsynced-microbatches",
                                                       "divergent-parameters"]
    cause = report["cause"]
    assert (cause["ranks"], cause["where"]) == ([0, 1], example_line(
        "accumulate_sync_on_first.py", "# FORWARD"))
    assert {k: cause["measured"][k] for k in ("first_step", "micro_batches", "synced_at")} \
        == {"first_step": 1, "micro_batches": 4, "synced_at": 1}
    parted = report["findings"][1]["measured"]
    assert parted["first_divergent_step"] == 2 and parted["ranks_differing_from_rank_0"] == [1]
    healthy, _ = run_example(distdoctor, tmp_path, "accumulate_with_no_sync.py", 2)
    assert healthy.returncode == 0, healthy.stdout


# the update that parts the replicas, from the ranks' own evidence: a setting, a factor
# on the synchronised gradient, or the optimiser's state; then the parameters part
@pytest.mark.parametrize("example, ranks, culprits, marker, measured, parted_at", [
    # rank 0 halves its learning rate after step 9: step 10's update differs, and the
    # parameters before step 11 with it, seen before step 12 (between the sampled steps,
    # the largest parameters are watched at every 4th)
    ("scheduler_on_rank_0.py", 2, [0], "# BUG",
     {"first_step": 10, "setting": "learning rate", "values": {"0": 0.025, "1": 0.05}}, 12),
    ("clip_on_rank0.py", 2, [0], "# BUG", {"first_step": 1}, 2),
    ("resume_optimizer_on_rank0.py", 2, [0], "# BUG",
     {"first_step": 1, "state": ["momentum_buffer"]}, 2),
    # 100 samples over 3 ranks: 34 on rank 0, 33 on the others, each's own learning rate
    ("lr_from_local_batch.py", 3, [0], "# BUG",
     {"first_step": 1, "values": {"0": 0.01 * 34 / 32, "1": 0.01 * 33 / 32,
                                  "2": 0.01 * 33 / 32}}, 2),
])
def test_replicas_that_update_apart_are_given_the_update_and_its_line(
        distdoctor, tmp_path, example, ranks, culprits, marker, measured, parted_at):
    done, report = run_example(distdoctor, tmp_path, example, ranks)
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert [c["kind"] for c in report["findings"]] == ["rank-dependent-update",
                                                       "divergent-parameters"]
    cause = report["cause"]
    assert (cause["kind"], cause["ranks"]) == ("rank-dependent-update", culprits)
    assert cause["where"] == example_line(example, marker)
    for key, value in measured.items():  # numbers to float precision, the rest exactly
        assert cause["measured"][key] == (pytest.approx(value) if isinstance(value, dict)
                                          else value), key
    assert report["findings"][1]["measured"]["first_divergent_step"] == parted_at
    assert f"look at: {example_line(example, marker)}" in done.stdout


# replicas known from how they communicate: a sync that fails leaves them replicas, its
# parting is reported, and the cause is named from the reductions themselves
@pytest.mark.parametrize("example, culprits, measured, lines", [
    # 4 parameters' gradients a step, 6 steps, none waited for on either rank
    ("unwaited_async_allreduce.py", [0, 1],
     {"unwaited": {"0": 24, "1": 24}, "first_step": 1}, ["# BUG", "    optimizer.step()"]),
    # rank 0 reduces encoder.weight (parameter 0) first, rank 1 decoder.weight (2)
    ("grads_paired_per_rank_order.py", [1],
     {"step": 1, "seq": 0, "parameters": {"0": [0], "1": [2]}}, ["# BUG"]),
])
def test_a_failed_sync_is_named_from_the_reductions_with_its_line_and_remedy(
        distdoctor, tmp_path, example, culprits, measured, lines):
    done, report = run_example(distdoctor, tmp_path, example, 2)
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert [c["kind"] for c in report["findings"]] == ["failed-sync", "divergent-parameters"]
    cause = report["cause"]
    assert (cause["kind"], cause["ranks"]) == ("failed-sync", culprits)
    for key, value in measured.items():
        assert cause["measured"][key] == value, key
    assert cause["where"] == example_line(example, lines[0])
    for marker in lines:
        assert example_line(example, marker) in done.stdout
    assert ("work.wait()" if "unwaited" in example else "one fixed order") in cause["fix"]


def test_a_gradient_clipped_on_one_rank_is_measured_as_the_factor_it_applied(distdoctor,
                                                                            tmp_path):
    """clip_on_rank0.py: rank 0 applies the averaged gradient times max_norm / its norm,
    rank 1 applies it whole; the factor is read from the gradients sampled, and the
    reference is the norm rank 0 printed (clip_grad_norm_ returns it)."""
    done, report = run_example(distdoctor, tmp_path, "clip_on_rank0.py", 2)
    norm = float(done.stdout.split("step 0: loss ")[1].split("gradient norm ")[1].split()[0])
    factors = report["cause"]["measured"]["factors"]
    assert factors["1"] == 1.0
    assert factors["0"] == pytest.approx(1.0 / norm, rel=2e-3)  # norm printed to 3 places


def test_light_tracing_leaves_the_silent_evidence_out(distdoctor, tmp_path):
    """--light traces calls only: the NaN that the full evidence names goes unseen."""
    done = distdoctor("run", "--light", "--report", str(tmp_path / "r.json"),
                      "nan_in_one_shard.py")
    report = json.loads((tmp_path / "r.json").read_text())
    assert done.returncode == 0 and report["findings"] == [], done.stdout


@pytest.mark.parametrize("example, ranks", [
    ("sampler_ok.py", 2), ("averaged_gradients.py", 2), ("accumulate_with_no_sync.py", 2),
    ("tp_clean.py", 2), ("tp_sequence_parallel_ok.py", 2), ("tp_dp_data_by_dp_rank.py", 4)])
def test_the_healthy_counterparts_are_ok(distdoctor, tmp_path, example, ranks):
    done, report = run_example(distdoctor, tmp_path, example, ranks)
    assert done.returncode == 0 and report["findings"] == [], done.stdout


def test_the_root_cause_traceback_comes_first_not_the_connection_errors(distdoctor, tmp_path):
    done, report = run_example(distdoctor, tmp_path, "rank_raises.py", 2, deadline=DEADLINE)
    root = next(r for r in report["ranks"] if r["rank"] == 1)
    assert root["state"] == "crashed" and "ValueError: corrupt batch at step 2" in root["error"]
    assert root["error"].splitlines()[1].strip().startswith('File "')  # starts at the script
    assert f"look at: {example_line('rank_raises.py', 'raise ValueError')}" in done.stdout
    assert done.stdout.index("rank 1 (root cause)") < done.stdout.index("rank 0:")


def test_ddp_unused_parameters_are_named_not_numbered(distdoctor, tmp_path):
    done, report = run_example(distdoctor, tmp_path, "ddp_unused_params.py", 2,
                               deadline=DEADLINE)
    assert "rank 1: aux.weight, aux.bias" in report["cause"]["summary"]
    assert "find_unused_parameters=True" in report["cause"]["fix"]


def test_a_rank_inside_ddps_own_collective_is_placed_by_the_flight_recorder(distdoctor,
                                                                            tmp_path):
    """The tracer never sees DDP's broadcast (made from C++); torch's Flight Recorder puts
    it at the place of rank 0's all-reduce, which proves the hang and says where rank 1 is."""
    done, report = run_example(distdoctor, tmp_path, "ddp_log_on_rank0.py", 2,
                               deadline=DEADLINE)
    assert "the hang was proven from the calls" in done.stdout
    rank1 = report["ranks"][1]
    assert rank1["state"] == "blocked" and rank1["call"] is None
    assert rank1["collective"] == ("waiting in DDP's own broadcast in its forward (broadcast "
                                   "#5 of the default group, by torch's Flight Recorder)")
    assert rank1["running"].endswith(example_line("ddp_log_on_rank0.py", "# FORWARD"))


def test_a_rank_in_ddps_backward_is_said_to_wait_there_and_the_other_is_blamed(distdoctor,
                                                                               tmp_path):
    """Only rank 0 calls barrier(); rank 1 goes on into the next backward, where DDP's
    gradient all-reduce waits for rank 0. The rank that only waits is not the culprit."""
    done, report = run_example(distdoctor, tmp_path, "ddp_barrier_on_rank0.py", 2,
                               deadline=DEADLINE)
    backward = example_line("ddp_barrier_on_rank0.py", "# BACKWARD")
    barrier = example_line("ddp_barrier_on_rank0.py", "# BUG")
    assert done.stdout.startswith("distdoctor run: FAILED: collective-mismatch (rank 0)\n")
    said = ("rank 1: blocked; waiting in DDP's gradient all-reduce (all_reduce #8 of the "
            f"default group, by torch's Flight Recorder), started by loss.backward() at "
            f"{backward}")
    assert said in done.stdout
    assert f"look at: {barrier}, {backward}\n" in done.stdout  # the culprit's line first
    # by the Flight Recorders, torch's own collectives included: at #8 rank 0's barrier met
    # DDP's gradient all-reduce, and only rank 0 ever ran the barrier's line
    assert f"rank 0 of 2 made barrier (#8) at {barrier}, from a line no other rank ran; " \
           f"rank 1 made all_reduce (#8, (9,), float32) at {backward}" in done.stdout
    # the README shows this run: its lines are this output's, word for word
    readme = (EXAMPLES.parent / "README.md").read_text()
    shown = readme.split("ddp_barrier_on_rank0.py\n", 1)[1].split("```")[0]
    assert shown.splitlines() == done.stdout.splitlines()[:len(shown.splitlines())]


def test_a_deadlock_is_proven_from_the_calls_long_before_the_deadline(distdoctor, tmp_path):
    deadline = 300.0
    done, report = run_example(distdoctor, tmp_path, "p2p_cycle.py", 2, deadline=deadline)
    assert "the hang was proven from the calls" in done.stdout
    printed = float(done.stdout.split("this diagnosis printed ")[1].split(" s")[0])
    assert printed < deadline
    assert report["cause"]["kind"] == "p2p-cycle"
    assert all(r["state"] == "blocked" and "dist.send(" in r["stack"] for r in report["ranks"])


@pytest.mark.parametrize("argv", [
    ["run", "missing.py"], ["run", "--nproc-per-node", "0", "clean.py"],
    ["run", "--deadline", "-1", "clean.py"], ["analyze", "/nonexistent-distdoctor-dir"],
])
def test_bad_usage_is_one_line_and_exit_code_2(distdoctor, argv):
    done = distdoctor(*argv)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def start_two_nodes(tmp_path: Path, example: str, per_node: int, trace_dirs: list[Path],
                    flags: tuple[str, ...] = ()) -> tuple[list[subprocess.Popen], str]:
    """Two torchrun agents on this machine (--nnodes 2, a static rendezvous on 127.0.0.1),
    as two machines would run them, each with the in-rank bootstrap writing into its
    ``trace_dirs`` entry (one folder each, or one shared, as on a shared filesystem); and
    the tag every process they start inherits, to find leaks."""
    port = free_port()  # for the agents' rendezvous
    agents, tag = [], uuid.uuid4().hex
    for node in range(2):
        scratch = tmp_path / f"node{node}-tmp"
        scratch.mkdir()
        agents.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
             str(node), "--nproc-per-node", str(per_node), "--master-addr", "127.0.0.1",
             "--master-port", str(port), "-m", "distdoctor.userjob", "--trace-dir",
             str(trace_dirs[node]), *flags, example],
            cwd=EXAMPLES, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=dict(os.environ, TMPDIR=str(scratch), GLOO_SOCKET_IFNAME="lo",
                     DISTDOCTOR_TEST_TAG=tag)))
    return agents, tag


def end_two_nodes(agents: list[subprocess.Popen], tag: str, stop: bool = False) -> list[int]:
    """Their exit codes, once they end (``stop``: SIGTERM them now, as a user would);
    every process they started is gone."""
    try:
        if stop:
            for agent in agents:
                os.killpg(agent.pid, signal.SIGTERM)
        return [agent.wait(120) for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait(30)
        assert proctable.wait_all_exit(sorted(proctable.tagged(tag)), 10) == set()


def test_two_nodes_each_writing_its_own_traces_are_analysed_as_one_job(distdoctor, tmp_path):
    """One rank a node: rank 1's NaN is on node 1, and only both directories together
    show it started there and reached rank 0 a step later."""
    agents, tag = start_two_nodes(tmp_path, "nan_in_one_shard.py", 1,
                                  [tmp_path / "node0", tmp_path / "node1"])
    assert end_two_nodes(agents, tag) == [0, 0]
    assert [p.name for p in sorted((tmp_path / "node1").glob("*.jsonl"))] == ["rank-1.jsonl"]
    report_path = tmp_path / "r.json"
    done = distdoctor("analyze", str(tmp_path / "node0"), str(tmp_path / "node1"),
                      "--report", str(report_path))
    cause = json.loads(report_path.read_text())["cause"]
    assert done.returncode == 1 and (cause["kind"], cause["ranks"]) == ("non-finite", [1])
    assert (cause["measured"]["origin_ranks"], cause["measured"]["reached"]) == ([1], {"0": 4})
    again = distdoctor("analyze", str(tmp_path / "node0"), str(tmp_path / "node0"))
    assert again.returncode == 2 and "not one job's" in again.stderr


def test_a_mesh_whose_tensor_parallel_pairs_span_two_nodes_is_named_and_its_fix_is_ok(
        distdoctor, tmp_path):
    """Two nodes of two ranks (torchrun numbers them: GROUP_RANK), the mesh (tp, dp): the
    tensor-parallel pairs [0, 2], [1, 3] each take a rank of both nodes. The same script
    with the mesh (dp, tp), tp_dp_data_by_dp_rank.py, keeps each pair in a node: OK."""
    verdicts = {}
    for example in ("tp_mesh_across_nodes.py", "tp_dp_data_by_dp_rank.py"):
        base = tmp_path / example
        base.mkdir()
        folders = [base / "node0", base / "node1"]
        agents, tag = start_two_nodes(base, example, 2, folders)
        assert end_two_nodes(agents, tag) == [0, 0]
        report = base / "r.json"
        done = distdoctor("analyze", *map(str, folders), "--report", str(report))
        verdicts[example] = (done.returncode, json.loads(report.read_text()))
    code, report = verdicts["tp_mesh_across_nodes.py"]
    cause = report["cause"]
    assert (code, cause["kind"], cause["ranks"]) == (1, "tp-across-nodes", [0, 1, 2, 3])
    assert cause["measured"] == {"tensor_groups": [[0, 2], [1, 3]], "ranks_per_node": 2,
                                 "nodes": {"0": "0", "1": "0", "2": "1", "3": "1"}}
    assert cause["where"] == example_line("tp_mesh_across_nodes.py", "= parallelize_module(")
    code, report = verdicts["tp_dp_data_by_dp_rank.py"]
    assert (code, report["findings"]) == (0, []), report["findings"]


def test_local_rank_passed_as_the_rank_on_two_nodes_is_proven_where_the_traces_meet(
        distdoctor, tmp_path):
    """Two nodes of two ranks writing into one folder (a shared filesystem): the node's
    watching rank sees all four wait in init_process_group, two for each rank, and proves
    it at once (start-up is otherwise judged by a two-minute deadline); with --exit-on-hang
    torchrun ends by itself."""
    shared = tmp_path / "traces"
    agents, tag = start_two_nodes(tmp_path, "startup_local_rank_as_rank.py", 2,
                                  [shared, shared], flags=("--exit-on-hang",))
    assert all(code != 0 for code in end_two_nodes(agents, tag))
    done = distdoctor("analyze", str(shared), "--report", str(tmp_path / "r.json"))
    cause = json.loads((tmp_path / "r.json").read_text())["cause"]
    assert (cause["kind"], cause["ranks"]) == ("duplicate-rank", [0, 1, 2, 3]), done.stdout
    assert "ranks 0, 2 both ask for rank 0; ranks 1, 3 both ask for rank 1" in \
        cause["summary"] and "passed LOCAL_RANK, the rank within each node" in cause["summary"]
    assert cause["where"] == example_line("startup_local_rank_as_rank.py", "# BUG")


def test_local_rank_passed_as_the_rank_is_named_from_two_nodes_folders_together(
        distdoctor, tmp_path):
    """Each node its own folder, as two machines: neither node sees the other's ranks, so
    nothing is proven there; stopped by the user once all four wait in init_process_group,
    ``analyze`` of both folders names the cause."""
    folders = [tmp_path / "node0", tmp_path / "node1"]
    agents, tag = start_two_nodes(tmp_path, "startup_local_rank_as_rank.py", 2, folders)
    traces = [folders[rank // 2] / f"rank-{rank}.jsonl" for rank in range(4)]

    def all_waiting() -> bool:
        return all(t.exists() and b'"ev":"init"' in t.read_bytes() for t in traces)

    try:
        give_up = time.monotonic() + 60
        while not all_waiting() and time.monotonic() < give_up:
            try:
                agents[0].wait(0.05)  # returns at once if node 0 ended: it should not have
                break
            except subprocess.TimeoutExpired:
                pass
        assert all_waiting(), [t.read_text() if t.exists() else None for t in traces]
    finally:
        end_two_nodes(agents, tag, stop=True)
    done = distdoctor("analyze", *map(str, folders), "--report", str(tmp_path / "r.json"))
    cause = json.loads((tmp_path / "r.json").read_text())["cause"]
    assert (cause["kind"], cause["ranks"]) == ("duplicate-rank", [0, 1, 2, 3]), done.stdout


def test_under_torchrun_a_deadlock_is_proven_from_the_traces_long_before_the_deadline(
        distdoctor, tmp_path):
    """Node-local rank 0 reads every rank's trace while it is blocked: the parting at #2
    is proven, each rank writes its stacks at once, not at the 300 s deadline, and with
    --exit-on-hang torchrun ends."""
    code, stderr = torchrun_example(tmp_path / "parted", "rank_zero_metric.py", 4, deadline=300,
                             flags=("--exit-on-hang",))
    assert code != 0 and "sees a deadlock proven from the traces (the ranks' collective " \
                         "#2 of the default group parted" in stderr
    assert (tmp_path / "parted" / "deadlock.json").exists()
    done = distdoctor("analyze", str(tmp_path / "parted"), "--report", str(tmp_path / "r.json"))
    cause = json.loads((tmp_path / "r.json").read_text())["cause"]
    assert done.returncode == 1 and (cause["kind"], cause["ranks"]) == ("collective-mismatch", [0])
    assert f"look at: {example_line('rank_zero_metric.py', '# BUG')}, " \
           f"{example_line('rank_zero_metric.py', '# LOOP')}\n" in done.stdout


def test_traces_written_under_a_real_torchrun_are_analysed_afterwards(distdoctor, tmp_path):
    torchrun_example(tmp_path / "crash", "rank_raises.py", 2)
    done = distdoctor("analyze", str(tmp_path / "crash"))
    assert done.returncode == 1 and "rank-crashed (rank 1)" in done.stdout


def test_a_silent_bug_under_a_real_torchrun_is_named_from_its_traces(distdoctor, tmp_path):
    torchrun_example(tmp_path / "epochs", "epoch_not_set.py", 2)
    done = distdoctor("analyze", str(tmp_path / "epochs"), "--report", str(tmp_path / "r.json"))
    report = json.loads((tmp_path / "r.json").read_text())
    assert done.returncode == 1 and report["cause"]["kind"] == "repeated-epoch-order"
    loop = example_line("epoch_not_set.py", "# LOOP")
    assert report["cause"]["where"].endswith(loop.split(":")[1])


def test_under_torchrun_a_rank_starting_late_is_not_called_hung(distdoctor, tmp_path):
    """Rank 1 joins 3 s after rank 0, which waits in init_process_group meanwhile: with a
    1 s deadline for the job, start-up is still not judged by it (deadlines.START_S is).
    Under load the same wait once made a 2 s deadline call a healthy start a hang."""
    code, stderr = torchrun_example(tmp_path / "late", "healthy/slow_start_one_rank.py", 2,
                                    deadline=1.0)
    assert code == 0 and "distdoctor: rank" not in stderr, stderr[-3000:]
    done = distdoctor("analyze", str(tmp_path / "late"))
    assert done.returncode == 0 and done.stdout.startswith("distdoctor analyze: OK"), \
        done.stdout


def test_under_torchrun_a_rank_loading_code_past_its_deadline_is_not_called_hung(
        distdoctor, tmp_path):
    """After joining, both ranks import fresh modules for 2.4 s before their first call,
    with a 1 s deadline: each rank's own watch sees its module count grow (DDP's first
    construction under a CPU hog once read as a hang this way)."""
    script = Path(__file__).parent / "launched" / "imports_slowly.py"
    code, stderr = torchrun_example(tmp_path / "loads", str(script), 2, deadline=1.0)
    assert code == 0 and "distdoctor: rank" not in stderr, stderr[-3000:]
    done = distdoctor("analyze", str(tmp_path / "loads"))
    assert done.returncode == 0 and done.stdout.startswith("distdoctor analyze: OK"), \
        done.stdout


def test_a_hang_under_torchrun_is_analysed_from_its_traces_and_stacks(distdoctor, tmp_path):
    torchrun_example(tmp_path / "hang", "p2p_cycle.py", 2, hangs=True)
    done = distdoctor("analyze", str(tmp_path / "hang"), "--report", str(tmp_path / "r.json"))
    report = json.loads((tmp_path / "r.json").read_text())
    assert done.returncode == 1 and report["cause"]["kind"] == "p2p-cycle"
    assert [r["state"] for r in report["ranks"]] == ["blocked", "blocked"]
    send = example_line("p2p_cycle.py", "dist.send(").split(":")[1]
    assert all(r["call"]["where"].endswith(send) for r in report["ranks"])
    for rank in (0, 1):  # dumped at the deadline and again at SIGTERM: shown once, by name
        # (under a CPU hog one rank's SIGTERM dump was once missing: torchrun's agent ended
        # it first; the deadline's dump is what the report reads)
        assert (tmp_path / "hang" / f"rank-{rank}.stacks").read_text().count(
            "p2p_cycle") in (1, 2)
        shown = report["ranks"][rank]["stack"]
        assert shown.startswith("Thread MainThread (main), most recent call last:\n"
                                f'  File "p2p_cycle.py", line {send}, in <module>\n')
        assert shown.count("most recent call last") == 1 and "distributed_c10d.py" not in shown
        assert "frames of torch, Python and distdoctor" in shown
    page = tmp_path / "hang.html"  # the same analysis drawn: the cycle and the blocked sends
    assert distdoctor("analyze", "--html", str(page), str(tmp_path / "hang")).returncode == 1
    drawn = page.read_text()
    assert "A cycle of waits: ranks 0 -&gt; 1 -&gt; 0" in drawn
    assert drawn.count('class="blocked"') == 2
    every = distdoctor("analyze", "--all-frames", str(tmp_path / "hang"))
    assert every.stdout.count("distributed_c10d.py") == 2  # rank 0's and rank 1's, once each
    assert "Thread distdoctor-stall-watch" in every.stdout


def test_under_torchrun_a_hung_rank_says_so_and_exit_on_hang_ends_the_job(distdoctor,
                                                                           tmp_path):
    """With the flag a stalled rank exits once its stacks are written, says so on stderr,
    and torchrun ends the job by itself (without it, the job waits on until stopped)."""
    # the deadline alone: the cycle would be proven from the traces long before it
    code, stderr = torchrun_example(tmp_path / "hang", "p2p_cycle.py", 2, flags=("--exit-on-hang",),
                             env={"DISTDOCTOR_PROOF": "0"})
    assert code != 0
    # the first rank to stall exits; torchrun may stop the other before its own deadline
    assert any(f"distdoctor: rank {rank} made no collective or point-to-point call for 2 s; "
               f"its stacks are in {tmp_path / 'hang' / f'rank-{rank}.stacks'}. This rank "
               f"now exits with code 124" in stderr for rank in (0, 1))
    done = distdoctor("analyze", str(tmp_path / "hang"))
    assert done.returncode == 1 and "p2p-cycle (ranks 0, 1)" in done.stdout


def test_under_torchrun_a_rank_that_waited_once_past_its_deadline_is_judged_where_it_hangs(
        distdoctor, tmp_path):
    """Rank 0 waits 5 s for a peer slow once, past its 2 s deadline: its watch writes a
    stall, sees the rank move on and says so, and writes the real hang (a metric only rank
    0 reduces) where it happens. Under a CPU hog a rank waiting while its peer built DDP
    was once judged by that first stall's samples, and the job was called hang-unknown."""
    script = Path(__file__).parent / "launched" / "slow_once_then_metric.py"
    _, stderr = torchrun_example(tmp_path / "traces", str(script), 2, hangs=True,
                                 deadline=2.0)
    assert "distdoctor: rank 0 moved on after" in stderr, stderr[-3000:]
    report = tmp_path / "r.json"
    done = distdoctor("analyze", str(tmp_path / "traces"), "--report", str(report))
    cause = json.loads(report.read_text())["cause"]
    assert done.returncode == 1 and (cause["kind"], cause["ranks"]) == (
        "collective-mismatch", [0]), done.stdout
    assert cause["where"].endswith(f":{line_number(script, '# BUG')}"), done.stdout
    waited = line_number(script, "# WAITED")
    assert f":{waited}" not in done.stdout.split("look at:")[-1].split("\n")[0], done.stdout


def test_a_rank_spinning_in_its_own_code_is_located_not_called_blocked(distdoctor, tmp_path):
    """Rank 1 never enters the all_reduce rank 0 waits in: it loops in its own function.
    The report says where (function and line, from its stack), that it is in no call, and
    the hang is declared at the deadline, within a second."""
    done, report = run_example(distdoctor, tmp_path, "rank_spins.py", 2, deadline=2.0)
    assert done.returncode == 1, done.stdout + done.stderr
    assert (report["cause"]["kind"], report["cause"]["ranks"]) == ("busy-rank", [1])
    waiting, spinning = report["ranks"]
    assert waiting["state"] == "blocked"
    assert waiting["call"]["where"] == example_line("rank_spins.py", "dist.all_reduce(grad)")
    assert spinning["state"] == "running" and spinning["call"] is None
    function, _, where = spinning["running"].partition(" at ")
    loop = {example_line("rank_spins.py", "while not flags"),
            example_line("rank_spins.py", "time.sleep")}
    assert function == "wait_until_ready" and where in loop, spinning["running"]
    assert "rank 1 ran wait_until_ready at rank_spins.py:" in done.stdout  # the verdict
    assert "rank 1: running, in no collective or send/receive: wait_until_ready" in done.stdout
    # a rank spinning in Python proves nothing: the timer decides
    declared = float(done.stdout.split("the hang was declared at the deadline ")[1].split(" s")[0])
    assert 2.0 <= declared <= 2.0 + 1.0


def test_every_rank_spinning_in_pure_python_is_located_at_a_line_of_its_loop(distdoctor,
                                                                             tmp_path):
    """The seed lesson's tree broadcast from another source: every rank of four spins on a
    growing big-int shift, in no call. Each is sampled as it is stopped and located at a
    line of its loop (Python gives many of the loop's instructions no line: never 0), and
    the verdict is the loop itself, as no rank waits for another."""
    done, report = run_example(distdoctor, tmp_path, "tree_broadcast_spins.py", 4,
                               deadline=2.0)
    assert done.returncode == 1, done.stdout + done.stderr
    assert (report["cause"]["kind"], report["cause"]["ranks"]) == ("busy-rank", [0, 1, 2, 3])
    source = (EXAMPLES / "tree_broadcast_spins.py").read_text().splitlines()
    first = next(n for n, text in enumerate(source, 1) if "while len(has_value)" in text)
    last = next(n for n, text in enumerate(source, 1) if "return x" in text)
    for rank in report["ranks"]:
        assert rank["state"] == "running", rank
        function, _, where = rank["running"].partition(" at ")
        assert function == "tree_broadcast" and where.startswith("tree_broadcast_spins.py:")
        assert first <= int(where.rsplit(":", 1)[1]) < last, where
        assert rank["seen"] and rank["seen"][0]["where"] == where  # the most seen first
        assert all(first <= int(s["where"].rsplit(":", 1)[1]) < last for s in rank["seen"])
        assert sum(s["times"] for s in rank["seen"]) <= rank["seen"][0]["of"]
    assert report["cause"]["where"].startswith("tree_broadcast_spins.py:")
    assert not re.search(r"\.py:0\b", done.stdout) and "line ???" not in done.stdout


def test_under_torchrun_a_spinning_rank_is_sampled_by_its_own_watch(distdoctor, tmp_path):
    """Under torchrun no process outside samples the rank: its own stall watch does, writes
    the lines it saw in its trace (through the JSON codec), and analyze reads them back."""
    torchrun_example(tmp_path / "spin", "rank_spins.py", 2, hangs=True)
    done = distdoctor("analyze", str(tmp_path / "spin"), "--report", str(tmp_path / "r.json"))
    report = json.loads((tmp_path / "r.json").read_text())
    assert done.returncode == 1 and report["cause"]["kind"] == "busy-rank", done.stdout
    spinning = report["ranks"][1]
    loop = {example_line("rank_spins.py", "while not flags"),
            example_line("rank_spins.py", "time.sleep")}
    assert spinning["state"] == "running" and spinning["seen"], spinning
    assert {s["where"] for s in spinning["seen"]} <= loop
    assert sum(s["times"] for s in spinning["seen"]) <= spinning["seen"][0]["of"] == 12


def test_a_rank_busy_holding_the_gil_is_its_own_verdict_at_its_own_line(distdoctor,
                                                                          tmp_path):
    """A regular expression backtracking on rank 1 holds the GIL, so only faulthandler can
    say where it is (a thread torch started in C, with no Python frame, is not taken for
    the main thread). The verdict is busy-rank, not a mismatch: which rank, where, for how
    long, and who waits for it where."""
    done, report = run_example(distdoctor, tmp_path, "rank_busy_validation.py", 2,
                               deadline=2.0)
    cause = report["cause"]
    assert (cause["kind"], cause["ranks"]) == ("busy-rank", [1]), done.stdout
    check = example_line("rank_busy_validation.py", "re.match(")
    assert cause["where"] == check and \
        cause["also_at"] == [example_line("rank_busy_validation.py", "# WAIT")]
    seconds = float(cause["summary"].split(f"rank 1 ran validate at {check} for ")[1]
                    .split(" s")[0])
    assert seconds >= 2.0  # at least the deadline: it was stopped there
    assert f"while rank 0 waits for it in all_reduce (#1, (8,), float32) at " \
           f"{example_line('rank_busy_validation.py', '# WAIT')}" in cause["summary"]
    assert report["ranks"][1]["running"] == f"validate at {check}"


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_forked_rank_starts_as_fresh_as_a_spawned_one(distdoctor, tmp_path, method):
    """Forked from a test process that has run torch ops, seeded its generators and
    replaced its streams, each rank still sees what a fresh interpreter gives it: its own
    environment, its working directory importable, fresh streams on fds 0-2, Python's
    signal dispositions, one thread, and random generators of its own (the same draws on
    every rank would hide a missing seed)."""
    import random

    import torch

    torch.manual_seed(0)
    random.seed(0)
    torch.rand(1000).sum()  # the launcher has used torch's threads
    script = Path(__file__).parent / "fresh_rank.py"
    done = distdoctor("run", "--nproc-per-node", "3", "--start-method", method, str(script),
                      str(tmp_path), "extra")
    assert done.returncode == 0, done.stdout + done.stderr
    seen = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(3)]
    assert [(s["rank"], s["world_size"]) for s in seen] == [(str(r), "3") for r in range(3)]
    for s in seen:
        assert (s["stdin_fd"], s["stdout_fd"], s["stderr_fd"]) == (0, 1, 2)
        assert s["sigint_raises"] and s["sigterm_default"] and s["threads"] == 1
        assert (s["main"], s["argv"]) == ("__main__", [str(tmp_path), "extra"])
        assert s["cwd_on_path"]  # as python -m distdoctor.userjob has it
    torch.manual_seed(0)
    random.seed(0)
    torch_draws = {repr(s["torch_draw"]) for s in seen} | {repr(torch.rand(4).tolist())}
    random_draws = {s["random_draw"] for s in seen} | {random.random()}
    assert len(torch_draws) == len(random_draws) == 4
    # (whole lines per rank are issue 18's: spawned ranks' prints can still be spliced)
    assert all(done.stdout.count(f"rank {r} says hello") == 1 for r in range(3))


def test_fork_is_refused_where_it_would_not_be_a_fresh_rank(distdoctor, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    done = distdoctor("run", "--start-method", "fork", "clean.py")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "OMP_NUM_THREADS=4" in done.stderr


def test_each_ranks_line_keeps_the_reduce_op_the_summary_names(distdoctor, tmp_path):
    done, report = run_example(distdoctor, tmp_path, "reduce_op_mismatch.py", 2,
                               deadline=DEADLINE)
    where = example_line("reduce_op_mismatch.py", "all_reduce")
    for rank, op in ((0, "SUM"), (1, "MAX")):
        said = f"all_reduce (#0, (1,), float32, {op}) at {where}"
        assert f"rank {rank}{' of 2' if rank == 0 else ''} made {said}" in done.stdout
        assert f"\nrank {rank}: exited; last call: {said}\n" in done.stdout + "\n"
        assert report["ranks"][rank]["call"]["reduce_op"] == op


def _tp_model():
    """The tensor-parallel examples' model and first batch, built as their rank 0 builds
    them (parallelize_module scatters rank 0's weights)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                          nn.Linear(16, 1))
    data = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    return model, data[:8]


def test_a_partial_sum_is_measured_as_one_process_computes_it(distdoctor, tmp_path):
    """Each rank's output of layer 2 is its 8 input columns' share plus the bias; the
    spread over the 64 sampled positions of the 8 x 16 output is worked out here."""
    import torch

    model, x = _tp_model()
    with torch.no_grad():
        h = torch.tanh(model[0](x))
        w, b = model[2].weight, model[2].bias
        parts = [h[:, r * 8:(r + 1) * 8] @ w[:, r * 8:(r + 1) * 8].T + b for r in (0, 1)]
    at = torch.linspace(0, 127, 64).round().long()
    expected = float((parts[0].reshape(-1)[at] - parts[1].reshape(-1)[at]).abs().max())
    _, report = run_example(distdoctor, tmp_path, "tp_partial_output.py", 2)
    assert report["cause"]["measured"]["spread"] == pytest.approx(expected, abs=1e-6)


def test_replica_drift_is_measured_as_one_process_computes_it(distdoctor, tmp_path):
    """After step 1, rank r's head took an SGD step (lr 0.05) with the gradient of its own
    4 rows' mean squared output alone: the two copies differ by 0.05 x the gap."""
    import torch

    model, x = _tp_model()
    after = []
    for r in (0, 1):
        model.zero_grad()
        model(x)[r * 4:(r + 1) * 4].pow(2).mean().backward()
        head = model[4]
        after.append(torch.cat([(head.weight - 0.05 * head.weight.grad).reshape(-1),
                                head.bias - 0.05 * head.bias.grad]).detach())
    expected = float((after[0] - after[1]).abs().max())
    _, report = run_example(distdoctor, tmp_path, "tp_sequence_parallel_head.py", 2)
    assert report["cause"]["measured"]["spread_per_step"]["1"] == pytest.approx(expected,
                                                                                abs=1e-6)


# The cases of the invariants issue under a real torchrun (the in-rank bootstrap writes
# the traces, nobody watches) and then ``analyze``: the same cause and ranks as
# ``distdoctor run`` gives, one case per way the evidence reaches the trace directory
# (the silent examples' recorders write the same events under both launchers, and
# epoch_not_set.py's silent case runs above): the optimiser's events, a rank gloo aborts
# (its faulthandler stacks), DDP's own collectives (the Flight Recorder history each
# stalled rank writes beside its trace), a rank busy holding the GIL (the node's watching
# rank asks it by SIGUSR1). A hang is stopped as a user would, once every rank wrote its
# stall stacks at its deadline: 2 s, or 5 s where the ranks build DDP first (on a busy
# machine a rank was quiet for 2 s while it built it, and its watch dumped its stacks and
# Flight Recorder history then, once, before the hang). Every example runs under
# ``distdoctor run`` above.
@pytest.mark.parametrize("example, ranks, hangs, kind, culprits", [
    ("scheduler_on_rank_0.py", 2, False, "rank-dependent-update", [0]),
    ("fsdp_gather_on_rank0_aborts.py", 2, False, "collective-mismatch", [0]),
    ("eval_on_rank0_through_ddp.py", 2, True, "collective-mismatch", [0]),
    ("rank_busy_validation.py", 2, True, "busy-rank", [1]),
    # a group that never forms: the in-rank watch proves it from the start-ups in the
    # trace directory, with no deadline (start-up is judged by a long one)
    ("startup_world_size.py", 2, True, "world-size-mismatch", [0, 1]),
    ("startup_two_ports.py", 2, True, "split-rendezvous", [0, 1]),
])
def test_each_invariant_case_under_a_real_torchrun_is_named_by_analyze(
        distdoctor, tmp_path, example, ranks, hangs, kind, culprits):
    torchrun_example(tmp_path / "traces", example, ranks, hangs=hangs,
              deadline=5.0 if "ddp" in example else 2.0)
    done = distdoctor("analyze", str(tmp_path / "traces"), "--report",
                      str(tmp_path / "r.json"))
    cause = json.loads((tmp_path / "r.json").read_text())["cause"]
    assert done.returncode == 1 and (cause["kind"], cause["ranks"]) == (kind, culprits), \
        done.stdout


# Every example's report says the same lines in both forms: the text's "look at" is the
# JSON cause's where and also_at, crashes included (once, a crash's JSON had "where": null
# while its text named the line). Placed last: most examples' runs are cached by then.
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py")
                 if p.name != "test_with_distdoctor.py" and not p.name.startswith("_"))


@pytest.mark.parametrize("example", SCRIPTS)
def test_the_json_report_carries_every_line_the_text_names(distdoctor, tmp_path, example):
    cached = [key for key in _RUNS if key[0] == example]
    done, report = run_example(distdoctor, tmp_path, *(cached[0] if cached else
                                                       (example, 2, DEADLINE)))
    said = next((line.split("look at: ", 1)[1].split(", ") for line in
                 done.stdout.splitlines() if line.startswith("  look at: ")), [])
    cause = report["cause"]
    carried = [cause["where"], *cause["also_at"]] if cause and cause["where"] else []
    assert carried == said, done.stdout
    # and no line is ever 0 or faulthandler's unknown (issue: a spinning rank at "line 0")
    assert not re.search(r"\.py:0\b", done.stdout) and "line ???" not in done.stdout
