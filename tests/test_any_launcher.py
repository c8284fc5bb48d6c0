"""Jobs distdoctor did not start: ``distdoctor run -- COMMAND`` (the command's own launcher
starts the ranks: mp.spawn, multiprocessing.Process, torchrun) and ``distdoctor attach
PID`` (a job already running, started by the test without distdoctor). Each checks the
verdict, the real ranks, the user's line, and that no process is left behind; attach
also that the job it read is still running afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import proctable
import pytest
from sources import line_number, line_of

from distdoctor.launch.ports import free_port

pytestmark = pytest.mark.tier("e2e")

EXAMPLES = Path(__file__).parent.parent / "examples"
LAUNCHED = Path(__file__).parent / "launched"


def run_command(distdoctor, tmp_path, *command: str, deadline: float = 60.0):
    report = tmp_path / "report.json"
    done = distdoctor("run", "--deadline", str(deadline), "--report", str(report), "--",
                      *command)
    return done, json.loads(report.read_text()) if report.exists() else None


def test_the_tutorials_shape_with_a_collective_on_rank_0_is_named_with_its_real_ranks(
        distdoctor, tmp_path):
    """mp.spawn's two children are ranks 0 and 1 (not the parent, whose
    ProcessExitedException the old 'run SCRIPT' reported); rank 0's logging all-reduce
    at its line is the cause. Rank 1 waits inside DDP's forward, which no proof sees:
    the group's deadline ends it."""
    script = EXAMPLES / "selflaunch" / "spawn_metric_on_rank0.py"
    done, report = run_command(distdoctor, tmp_path, sys.executable, str(script.relative_to(
        EXAMPLES)), deadline=3.0)
    assert done.returncode == 1, done.stdout + done.stderr
    cause = report["cause"]
    assert (cause["kind"], cause["ranks"]) == ("collective-mismatch", [0]), done.stdout
    assert cause["where"] == line_of(script, "# BUG", EXAMPLES)
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert "ProcessExitedException" not in done.stdout
    assert "stopped by distdoctor (process group 1 hung)" in done.stdout


def test_the_tutorial_itself_is_healthy_and_its_output_passes_through(distdoctor, tmp_path):
    done, report = run_command(distdoctor, tmp_path, sys.executable,
                               "healthy/selflaunch/spawn_tutorial.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert report["status"] == "ok" and [r["state"] for r in report["ranks"]] == [
        "finished", "finished"]
    assert "step 3: loss" in done.stdout  # rank 0's own print, as the command wrote it
    assert "exited with code 0" in done.stdout


def test_a_multiprocessing_process_job_with_a_file_rendezvous_names_the_raising_rank(
        distdoctor, tmp_path):
    """multiprocessing prints rank 1's traceback and exits 1; rank 0 fails with gloo's
    'Connection closed by peer'. The rank's own error comes first, at its line."""
    script = EXAMPLES / "selflaunch" / "process_file_rendezvous.py"
    done, report = run_command(distdoctor, tmp_path, sys.executable,
                               "selflaunch/process_file_rendezvous.py")
    assert done.returncode == 1
    cause = report["cause"]
    assert (cause["kind"], cause["ranks"]) == ("rank-crashed", [1]), done.stdout
    assert "FileNotFoundError: shard-1.pt" in cause["summary"]
    rank1 = report["ranks"][1]
    assert f'line {line_number(script, "# BUG")}, in load_shard' in rank1["error"]
    assert "exited with code 1" in done.stdout


def test_a_silent_bug_in_each_of_two_process_groups_is_named_in_each(distdoctor, tmp_path):
    """One mp.spawn per learning rate: two process groups over the command's life, told
    apart, each with gradients summed over its 2 ranks (2x the mean)."""
    script = EXAMPLES / "selflaunch" / "spawn_summed_gradients.py"
    done, report = run_command(distdoctor, tmp_path, sys.executable,
                               "selflaunch/spawn_summed_gradients.py")
    assert done.returncode == 1
    assert "== process group 1 of 2 (2 ranks, init_process_group at " \
           f"{line_of(script, 'dist.init_process_group(', EXAMPLES)})" in done.stdout
    assert "== process group 2 of 2" in done.stdout
    assert done.stdout.count("FAILED: sum-without-mean (ranks 0, 1)") == 2
    assert report["cause"]["measured"]["ratio"] == pytest.approx(2.0, abs=0.01)
    assert report["cause"]["where"] == line_of(script, "# BUG", EXAMPLES)
    assert "exited with code 0" in done.stdout  # the command itself succeeded


def test_run_torchrun_as_a_command_traces_a_group_formed_by_init_device_mesh(
        distdoctor, tmp_path):
    """torchrun starts the ranks; init_device_mesh calls init_process_group by the name it
    took while torch.distributed was imported (the hook replaces that one too)."""
    done, report = run_command(distdoctor, tmp_path, sys.executable, "-m",
                               "torch.distributed.run", "--standalone", "--nproc-per-node",
                               "2", "mesh_metric_on_rank0.py")
    assert done.returncode == 1
    cause = report["cause"]
    assert cause["kind"] == "collective-mismatch", done.stdout
    script = EXAMPLES / "mesh_metric_on_rank0.py"
    assert {cause["where"], *cause["also_at"]} == {line_of(script, "# BUG", EXAMPLES),
                                                  line_of(script, "dist.barrier()", EXAMPLES)}
    assert [(r["rank"], r["call"]["op"]) for r in report["ranks"]] == [
        (0, "all_reduce"), (1, "barrier")]


@pytest.mark.parametrize("example, kind, says", [
    ("startup_world_size.py", "world-size-mismatch", "ranks 2, 3 never come"),
    ("startup_two_ports.py", "split-rendezvous", ":29511"),  # (torchrun's host: localhost)
])
def test_a_group_that_never_forms_under_torchrun_is_named_not_waited_on(
        distdoctor, tmp_path, example, kind, says):
    """A rank is traced once init_process_group returns, and in a group that never forms
    it never does: each rank's note of what it gave the call proves it once both wait in
    it (without it the command waited out torch's 30-minute timeout, even past the
    deadline, which counts from a group's first call)."""
    done, report = run_command(distdoctor, tmp_path, sys.executable, "-m",
                               "torch.distributed.run", "--standalone", "--nproc-per-node",
                               "2", example)
    assert done.returncode == 1, done.stdout + done.stderr
    cause = report["cause"]
    assert (cause["kind"], cause["ranks"]) == (kind, [0, 1]), done.stdout
    assert says in cause["summary"]
    assert cause["where"] == line_of(EXAMPLES / example, "dist.init_process_group", EXAMPLES)
    assert "stopped by distdoctor (process group 1 hung)" in done.stdout
    assert [(r["rank"], r["state"]) for r in report["ranks"]] == [(0, "blocked"),
                                                                  (1, "blocked")]


def two_torchruns(port: int, node_flags: tuple[tuple[str, ...], tuple[str, ...]],
                  script: str = "healthy/ddp_steps.py") -> list[str]:
    """One command that starts two torchrun agents of one rank each, as two machines would
    start them, with each node's own flags."""
    agent = f"{sys.executable} -m torch.distributed.run --nproc-per-node 1"
    nodes = [f"{agent} {' '.join(flags)} {script}" for flags in node_flags]
    return ["sh", "-c", f"{nodes[0]} & {nodes[1]}; wait"]


@pytest.mark.parametrize("kind, node_flags, says", [
    ("rdzv-id", (("--nnodes 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{port} "
                  "--rdzv-id job-a"),
                 ("--nnodes 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{port} "
                  "--rdzv-id job-b")),
     ("--rdzv-id job-a", "--rdzv-id job-b", "wait in different rendezvous")),
    ("nnodes", (("--nnodes 3 --node-rank 0 --master-addr 127.0.0.1 --master-port {port}"),
                ("--nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port {port}")),
     ("--nnodes 3", "--nnodes 2", "wait for different numbers of nodes")),
], ids=["rdzv-id", "nnodes"])
def test_torchrun_nodes_that_can_never_meet_are_named_before_any_rank(
        distdoctor, tmp_path, kind, node_flags, says):
    """Two nodes' agents at one endpoint asking for another --rdzv-id (a dynamic
    rendezvous) or --nnodes (a static one): each agent notes what it waits for, so the
    split is proven once both have, where torchrun waits out its 600 s join timeout."""
    port = free_port()
    flags = tuple(tuple(f.format(port=port).split()) for f in node_flags)
    done, report = run_command(distdoctor, tmp_path, *two_torchruns(port, flags))
    assert done.returncode == 1, done.stdout + done.stderr
    cause = report["cause"]
    assert (cause["kind"], cause["ranks"]) == ("rendezvous-mismatch", []), done.stdout
    assert all(part in cause["summary"] for part in says), cause["summary"]
    assert "FAILED: rendezvous-mismatch (before any rank)" in done.stdout
    assert "stopped by distdoctor (its rendezvous of nodes never completes)" in done.stdout
    assert report["ranks"] == []


def test_a_node_alone_in_its_rendezvous_is_named_when_its_agent_gives_up(distdoctor, tmp_path):
    """--nnodes 2 and one node started: its agent's join timeout (3 s here) ends it, and
    what it waited for and who came is said (past the start-up deadline, the same)."""
    port = free_port()
    done, report = run_command(
        distdoctor, tmp_path, sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
        "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
        f"127.0.0.1:{port}", "--rdzv-id", "alone", "--rdzv-conf", "join_timeout=3",
        "healthy/ddp_steps.py")
    assert done.returncode == 1, done.stdout + done.stderr
    cause = report["cause"]
    assert cause["kind"] == "rendezvous-incomplete", done.stdout
    assert f"torchrun's rendezvous 'alone' at 127.0.0.1:{port} never completed" in \
        cause["summary"] and "waits for 2 nodes (--nnodes 2) and gave up " \
        "(RendezvousTimeoutError)" in cause["summary"], cause["summary"]
    assert "exited with code 1" in done.stdout and "(no rank was started)" in done.stdout


@pytest.mark.parametrize("node_flags", [
    ("--nnodes 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{port} --rdzv-id same",) * 2,
    # an elastic range, one node: torchrun goes on once its last call for more ends
    ("--nnodes 1:2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{port} --rdzv-id one "
     "--rdzv-conf last_call_timeout=1", None),
], ids=["two-nodes", "elastic-1-of-2"])
def test_torchrun_nodes_that_meet_are_ok(distdoctor, tmp_path, node_flags):
    port = free_port()
    flags = [tuple(f.format(port=port).split()) for f in node_flags if f is not None]
    command = two_torchruns(port, (flags[0], flags[1])) if len(flags) == 2 else \
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", *flags[0],
         "healthy/ddp_steps.py"]
    done, report = run_command(distdoctor, tmp_path, *command)
    assert done.returncode == 0 and report["status"] == "ok", done.stdout + done.stderr
    assert [r["state"] for r in report["ranks"]] == ["finished"] * len(flags), done.stdout


def test_a_command_that_never_forms_a_group_runs_untraced_with_the_users_sitecustomize(
        distdoctor, tmp_path, monkeypatch):
    """The hook costs a process nothing until init_process_group, and the user's own
    sitecustomize (shadowed by ours on PYTHONPATH) still runs."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    done, report = run_command(distdoctor, tmp_path, sys.executable, "-c",
                               "import os, sys; print('site', os.environ.get('USER_SITE_RAN'));"
                               " print('torch', 'torch' in sys.modules); sys.exit(3)")
    assert done.returncode == 1 and report is None
    assert "site yes" in done.stdout and "torch False" in done.stdout
    assert "initialised a process group" in done.stdout and "exited with code 3" in done.stdout


@pytest.mark.parametrize("argv", [
    ["run", "--"], ["run", "--nproc-per-node", "4", "--", "python", "x.py"],
    ["run", "--", "/nonexistent/distdoctor-command"], ["attach", "0"], ["attach", "x"],
    ["attach", "999999999"], ["run", "--patch", "p.diff", "clean.py"],
    ["run", "--apply", "clean.py"], ["resume-check", "--"], ["resume-check"],
    ["resume-check", "--nproc-per-node", "3", "--", "python", "x.py"],
    ["resume-check", "--", "/nonexistent/distdoctor-command"],
])
def test_bad_usage_is_one_line_and_exit_code_2(distdoctor, argv):
    done = distdoctor(*argv)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr


class Job:
    """A job the test starts the way its owner would, without distdoctor: every process
    it makes carries a tag in its environment, so none can leak unseen."""

    def __init__(self, argv: list[str], tmp_path: Path, env: dict[str, str] | None = None):
        self.tag = uuid.uuid4().hex
        scratch = tmp_path / "tmp"
        scratch.mkdir(exist_ok=True)
        self.process = subprocess.Popen(
            argv, cwd=EXAMPLES, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, env=dict(os.environ, TMPDIR=str(scratch),
                                             DISTDOCTOR_TEST_TAG=self.tag, **(env or {})))

    def processes(self) -> set[int]:
        return proctable.tagged(self.tag)

    def stop(self) -> None:
        """Every process of the job (torchrun's workers have sessions of their own, and
        outlive an agent killed outright)."""
        for pid in self.processes() | ({self.process.pid} if self.process.poll() is None
                                       else set()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(30)
        assert proctable.wait_all_exit(sorted(self.processes()), 10) == set()


def attach_until_stuck(distdoctor, job: Job, tmp_path: Path, *flags: str):
    """``distdoctor attach`` on the job's launcher until it finds the job stuck (it starts
    ranks, imports torch and reaches its hang first): the last answer and its report."""
    report = tmp_path / "attach.json"
    give_up = time.monotonic() + 90
    while True:
        done = distdoctor("attach", str(job.process.pid), "--report", str(report), *flags)
        if done.returncode == 1 or time.monotonic() > give_up or job.process.poll() is not None:
            return done, json.loads(report.read_text()) if report.exists() else None


def test_attach_names_a_hung_plain_torchrun_job_and_leaves_it_running(distdoctor, tmp_path):
    job = Job([sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", "conditional_collective.py"], tmp_path)
    try:
        done, report = attach_until_stuck(distdoctor, job, tmp_path)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "numbered by RANK in its environment" in done.stdout
        cause = report["cause"]
        assert cause["kind"] == "collective-mismatch", done.stdout
        script = EXAMPLES / "conditional_collective.py"
        assert {cause["where"], *cause["also_at"]} >= {line_of(script, "# BUG", EXAMPLES),
                                                     line_of(script, "dist.barrier()", EXAMPLES)}
        assert [(r["rank"], r["call"]["op"]) for r in report["ranks"]] == [
            (0, "all_reduce"), (1, "barrier")]
        running = job.processes()
        assert job.process.poll() is None and all(proctable.alive(p) for p in running)
        stopped = subprocess.run([sys.executable, "-m", "distdoctor", "attach", "--stop",
                                  str(job.process.pid)], capture_output=True, text=True,
                                 timeout=120)  # from another shell, as its owner would
        assert stopped.returncode == 1, stopped.stdout + stopped.stderr
        job.process.wait(10)
        assert proctable.wait_all_exit(sorted(running), 10) == set()
    finally:
        job.stop()


def test_attach_names_a_group_that_never_forms_from_the_stacks_and_the_environment(
        distdoctor, tmp_path):
    """Both ranks inside init_process_group: what each gave it is read from that frame's
    locals (py-spy, without stopping it) and the launcher's variables from /proc, and the
    same check as run's names the cause; the job is left running."""
    job = Job([sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", "startup_world_size.py"], tmp_path)
    try:
        done, report = attach_until_stuck(distdoctor, job, tmp_path)
        assert done.returncode == 1, done.stdout + done.stderr
        cause = report["cause"]
        assert (cause["kind"], cause["ranks"]) == ("world-size-mismatch", [0, 1]), done.stdout
        assert "ranks 2, 3 never come" in cause["summary"]
        assert cause["where"] == line_of(EXAMPLES / "startup_world_size.py",
                                         "dist.init_process_group", EXAMPLES)
        assert "sequences parted" not in done.stdout  # no collective sequence yet
        assert job.process.poll() is None
    finally:
        job.stop()


def test_attach_names_torchrun_nodes_that_can_never_meet_from_their_command_lines(
        distdoctor, tmp_path):
    """No rank exists: attach finds the two agents inside next_rendezvous (py-spy), reads
    what each waits for from its command line (torchrun's own parser) and names the
    split; the job is left running."""
    port = free_port()
    flags = [("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
              f"127.0.0.1:{port}", "--rdzv-id", name) for name in ("job-a", "job-b")]
    job = Job(two_torchruns(port, (flags[0], flags[1])), tmp_path)
    try:
        done, report = attach_until_stuck(distdoctor, job, tmp_path)
        assert done.returncode == 1, done.stdout + done.stderr
        cause = report["cause"]
        assert (cause["kind"], cause["ranks"]) == ("rendezvous-mismatch", []), done.stdout
        assert ": --rdzv-id job-a; " in cause["summary"] and cause["summary"].endswith(
            ": --rdzv-id job-b"), cause["summary"]
        assert "FAILED: rendezvous-mismatch (before any rank)" in done.stdout
        assert job.process.poll() is None  # left running
    finally:
        job.stop()


def test_attach_names_a_hung_mp_spawn_job_from_the_ranks_stacks(distdoctor, tmp_path):
    script = EXAMPLES / "selflaunch" / "spawn_metric_on_rank0.py"
    job = Job([sys.executable, "selflaunch/spawn_metric_on_rank0.py"], tmp_path)
    try:
        done, report = attach_until_stuck(distdoctor, job, tmp_path)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "ranks 0, 1 of 2" in done.stdout and "mp.spawn's index" in done.stdout
        cause = report["cause"]
        assert (cause["kind"], cause["ranks"]) == ("collective-mismatch", [0]), done.stdout
        assert cause["where"] == line_of(script, "# BUG", EXAMPLES)
        assert "DDP's own broadcast in its forward" in cause["summary"]
        ranks = [int(p) for p in done.stdout.split("(process ")[1].split(";")[0].split(", ")]
        assert job.process.poll() is None and all(proctable.alive(p) for p in ranks)
    finally:
        job.stop()


def test_attach_asks_for_flight_recorder_dumps_through_the_dump_pipe(distdoctor, tmp_path):
    """Every rank waits in the same all-reduce line: the stacks cannot say where the ranks
    parted, the recorders' histories can (#3, counted from 1: rank 0's extra metric)."""
    script = LAUNCHED / "dump_pipe_hang.py"
    job = Job([sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", str(script)], tmp_path,
              env={"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / "pipe_"),
                   "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "dump_")})
    try:
        done, report = attach_until_stuck(distdoctor, job, tmp_path)
        assert done.returncode == 1, done.stdout + done.stderr
        cause = report["cause"]
        assert (cause["kind"], cause["ranks"]) == ("collective-mismatch", [0]), done.stdout
        assert "collective #3 of the default group" in cause["summary"]  # FR counts from 1
        assert cause["where"].endswith(f":{line_number(script, '# BUG')}")
        assert {p.name for p in tmp_path.glob("dump_*")} == {"dump_0", "dump_1"}
        assert job.process.poll() is None
    finally:
        job.stop()


def test_a_rank_py_spy_fails_to_read_is_read_again_never_called_exited(distdoctor, tmp_path,
                                                                        monkeypatch):
    """The suite once saw attach call a live rank 0 "exited" (rank-exited-early) because
    py-spy's first read of it failed on a busy machine (its 10 s timeout). py-spy's answer
    is forced here: a failed first read of rank 0 is tried again, and one that keeps
    failing is said as such, exit 2, while the job runs on."""
    from distdoctor.userjob.attaching import attach, pyspy

    real, failed = pyspy.dump, set()

    def flaky(pid: int, with_locals: bool = True):
        if attach._environment(pid).get("RANK") == "0" and (always or pid not in failed):
            failed.add(pid)
            raise pyspy.StackReadError(f"py-spy took over 10 s to read process {pid}")
        return real(pid, with_locals)

    monkeypatch.setattr(pyspy, "dump", flaky)
    job = Job([sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", "conditional_collective.py"], tmp_path)
    try:
        always = False
        done, report = attach_until_stuck(distdoctor, job, tmp_path)
        assert done.returncode == 1 and failed, done.stdout + done.stderr
        assert (report["cause"]["kind"], len(report["ranks"])) == ("collective-mismatch", 2)
        always = True
        done = distdoctor("attach", str(job.process.pid))
        assert done.returncode == 2, done.stdout + done.stderr
        assert "rank 0 (process " in done.stderr and "is running but its stacks could not " \
            "be read (py-spy took over 10 s" in done.stderr
        assert job.process.poll() is None
    finally:
        job.stop()


def test_attach_leaves_a_healthy_job_alone_even_when_its_stacks_repeat(distdoctor, tmp_path):
    """A loop of all-reduces with no counter reads the same at every stack read; its main
    threads still run (their CPU time and context switches grow): not stuck."""
    job = Job([sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", str(LAUNCHED / "steady_loop.py")], tmp_path)
    try:
        give_up = time.monotonic() + 60
        while True:  # until both ranks are up and in their loop
            done = distdoctor("attach", str(job.process.pid))
            if "ranks 0, 1 of 2" in done.stdout or time.monotonic() > give_up:
                break
        for _ in range(2):
            # (once, the second read found no rank: what was alive then is kept to tell a
            # job that ended from ranks attach could not read)
            assert done.returncode == 0, (done.stdout, done.stderr, job.process.poll(),
                                          {p: proctable.alive(p) for p in job.processes()})
            assert "not stuck in communication" in done.stdout
            done = distdoctor("attach", str(job.process.pid))
    finally:
        job.stop()


def test_py_spy_s_refusal_and_odd_answers_become_one_line_or_nothing():
    """What attach says when ptrace is refused (root here cannot be refused: the message
    is checked as py-spy words it), and py-spy JSON of the wrong shape is skipped."""
    from distdoctor.userjob.attaching import pyspy

    said = pyspy._why(42, "Error: Permission denied (os error 13)\n")
    assert said.count("\n") == 0 and "ptrace_scope=0" in said and "SYS_PTRACE" in said
    assert pyspy.parse(1, {"not": "a list"}).threads == ()
    odd = pyspy.parse(1, [7, {"thread_name": "MainThread", "frames": [
        {"name": "Module.run", "filename": "a.py", "line": "x"}, "junk"]}])
    assert [(f.function, f.line) for f in odd.threads[0].frames] == [("run", 0)]


def test_a_launcher_read_while_it_imports_torch_distributed_is_no_rank():
    """attach polled a starting torchrun: its agent, read while importing torch.distributed,
    looked like a rank, and attach took it for one rank of a job and widened its search to
    the test runner's other children (another test's ranks were reported). A thread inside
    an import is not in torch.distributed's communication; one in a collective is."""
    from distdoctor.models.record import Frame, ThreadStack
    from distdoctor.userjob.attaching import attach
    from distdoctor.userjob.attaching.pyspy import Snapshot

    def snapshot(*files: str) -> Snapshot:
        frames = tuple(Frame(file, 1, "f") for file in files)
        return Snapshot(1, (ThreadStack("MainThread", True, frames),), ((),), (True,))

    site = "/venv/lib/python3.11/site-packages/torch/distributed/"
    importing = snapshot("/venv/lib/python3.11/runpy.py", "<frozen importlib._bootstrap>",
                         "<frozen importlib._bootstrap_external>", site + "__init__.py",
                         site + "distributed_c10d.py")
    waiting = snapshot("train.py", site + "c10d_logger.py", site + "distributed_c10d.py")
    assert not attach._in_distributed(importing) and attach._in_distributed(waiting)


def test_ctrl_c_stops_the_commands_whole_tree(tmp_path):
    """The command runs in a process group of its own (a terminal's Ctrl-C reaches
    distdoctor alone); distdoctor then stops every process the command started, ranks
    and mp.spawn's parent alike, and exits 130."""
    tag = uuid.uuid4().hex
    runner = subprocess.Popen(
        [sys.executable, "-m", "distdoctor", "run", "--", sys.executable,
         "selflaunch/spawn_metric_on_rank0.py"], cwd=EXAMPLES, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=dict(os.environ, DISTDOCTOR_TEST_TAG=tag))
    try:
        give_up = time.monotonic() + 60
        while len(_ranks_spawned(tag)) < 2 and time.monotonic() < give_up:
            runner.poll()  # until mp.spawn has started both ranks
        runner.send_signal(signal.SIGINT)
        _, err = runner.communicate(timeout=60)
        assert runner.returncode == 130, err
        assert proctable.wait_all_exit(sorted(proctable.tagged(tag)), 10) == set()
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()


def _ranks_spawned(tag: str) -> list[int]:
    found = []
    for pid in proctable.tagged(tag):
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


def test_a_rank_no_new_read_reaches_keeps_its_reads_and_one_never_read_is_said():
    """On a busy machine py-spy can fail on a rank at every read (it once timed out on
    all four of a settling round, and attach ended in an IndexError): the rank keeps
    the reads it had, and a rank never read is reported as such, not as a crash."""
    from distdoctor.userjob.attaching import attach, pyspy

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid now names no process: every read of it fails
    first = attach.Read(pyspy.Snapshot(gone.pid, (), (), ()), 0)
    job = attach.Job(0, (attach.RankProcess(0, gone.pid, "test", {}),
                         attach.RankProcess(1, gone.pid, "test", {})), 2,
                     {0: (first,), 1: ()}, ())
    again = attach.read_again(job, fresh=True)
    assert again.reads[0] == (first,) and again.missed == {}  # gone: not a rank that moved
    ends = attach.evidence(job, {}).ends
    assert ends[1].status == "hung" and "could not be read" in (ends[1].error or "")


def test_a_read_that_fails_on_a_live_rank_is_not_evidence_that_it_stood_still(monkeypatch):
    """py-spy reads without pausing, and fails where frames change under it ("Failed to
    copy PyFrameObject: Bad address"). Under load the suite saw a rank importing torch
    keep only its first read: its reads "all agreed", and attach named it
    rank-never-joined while it was on its way. A read failed that way is movement (a
    timeout is not); the next settling round starts clean."""
    from distdoctor.userjob.attaching import attach, pyspy

    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        first = attach.Read(pyspy.Snapshot(alive.pid, (), (), ()), 0)

        def fails(pid: int, with_locals: bool = True):
            raise error

        monkeypatch.setattr(pyspy, "dump", fails)
        alone = attach.Job(0, (attach.RankProcess(0, alive.pid, "test", {}),), 1,
                           {0: (first,)}, ())
        error = pyspy.StackReadError("py-spy took over 10 s to read process")
        assert attach.read_again(alone).missed == {}  # slow says nothing of moving
        error = pyspy.FramesMoved("Failed to copy PyFrameObject: Bad address (os error 14)")
        job = attach.read_again(alone)
        assert job.reads[0] == (first,) and "Bad address" in job.missed[0]
        reading = attach.evidence(job, {})
        assert reading.moving == (0,), reading
        assert "changed while py-spy read them" in (reading.ends[0].error or "")
        monkeypatch.setattr(pyspy, "dump", lambda pid, with_locals=True: first.snapshot)
        assert attach.read_again(job, fresh=True).missed == {}
    finally:
        alive.kill()
        alive.wait()
