"""Soak: run the demo, the test suite, one diagnose case and the straggler examples many
times, and count failures.

A verdict that fails one time in twenty looks green on a developer's single run and red
in somebody's nightly CI. This runs each job as a separate command, K times, optionally
under `--load` (one busy-looping process per core for the whole soak, each bounded in time
and stopped with the soak), and prints per job how many runs failed. The output of every
failing run is kept under --keep (default soak-failures/), named by job and run number.

    python bench/soak.py                      # demo x10, suite x5, diagnose x50, and the
                                              # property tests once, exploring
    python bench/soak.py --load --suite 0     # demo and diagnose under a CPU hog
    python bench/soak.py --demo 0 --suite 0 --diagnose 20 \\
        --case "--strategy pipe-1f1b --fault send-before-receive --world-size 4"
    python bench/soak.py --demo 0 --suite 0 --diagnose 0 --explore 0 --stragglers 20 --load
                                              # each straggler example, and the healthy
                                              # loop, 20 times on 4 ranks, under a CPU hog

Exit 0 when every run passed, 1 when any failed.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CASE = "--strategy pipe-1f1b --fault send-before-receive --world-size 4"
# the hypothesis tests, run with fresh random examples (the suite's are the same each run)
PROPERTY_TESTS = ("tests/test_collective_properties.py", "tests/test_models.py")
# each straggler example with the rank it must name, and the healthy loop it must call OK
STRAGGLERS = {"straggler_slow_loader.py": 1, "straggler_extra_compute.py": 2,
              "straggler_rank0_logging.py": 0, "healthy/ddp_steps.py": None}
# one core's worth of busy loop that ends by itself, whatever happens to the soak
HOG = ("import sys, time\nend = time.monotonic() + float(sys.argv[1])\n"
       "while time.monotonic() < end: pass\n")


@dataclass(frozen=True)
class Job:
    name: str
    argv: tuple[str, ...]
    runs: int
    timeout_s: float


def jobs(args: argparse.Namespace) -> list[Job]:
    python = sys.executable
    found = [
        Job("demo --all", (python, "-m", "distdoctor", "demo", "--all"), args.demo, 900),
        Job("test suite", (python, "-m", "pytest", "-q", "-p", "no:cacheprovider"), args.suite,
            1800),
        Job(f"diagnose {args.case}", (python, "-m", "distdoctor", "diagnose",
                                      *shlex.split(args.case)), args.diagnose, 300),
        Job("property tests, exploring", (python, "-m", "pytest", "-q", "-p",
                                          "no:cacheprovider", "--hypothesis-profile=explore",
                                          *PROPERTY_TESTS), args.explore, 3600),
    ]
    found += [Job(f"straggler {script}", (python, str(ROOT / "bench" / "soak.py"),
                                          "--expect-straggler", script), args.stragglers, 300)
              for script in STRAGGLERS]
    return [job for job in found if job.runs > 0]


def expect_straggler(script: str) -> int:
    """One run of a straggler example (or the healthy loop) under ``distdoctor run`` on 4
    ranks: 0 when the report names the rank it must (or, for the healthy loop, says OK
    and leaves nothing undecided), 1 otherwise, with what it said instead."""
    import json
    import tempfile

    wanted = STRAGGLERS[script]
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        done = subprocess.run([sys.executable, "-m", "distdoctor", "run", "--nproc-per-node",
                               "4", "--report", str(report), script], cwd=ROOT / "examples",
                              capture_output=True, text=True)
        said = json.loads(report.read_text()) if report.exists() else None
    print(done.stdout[-3000:] + done.stderr[-2000:])
    if said is None:
        return 1
    found = [(f["kind"], f["ranks"]) for f in said["findings"]]
    if wanted is None:
        return 0 if not found and not said.get("undecided") else 1
    return 0 if found == [("straggler", [wanted])] else 1


def start_load(seconds: float) -> list[subprocess.Popen]:
    """One hog per core, in its own session so it can be killed as a group."""
    return [subprocess.Popen([sys.executable, "-c", HOG, str(seconds)], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(os.cpu_count() or 1)]


def stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def run_once(job: Job) -> tuple[bool, str, float]:
    """(passed, output, seconds) for one run of ``job``; a run past its timeout fails, and
    its whole process group is killed."""
    start = time.monotonic()
    process = subprocess.Popen(job.argv, cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=job.timeout_s)
        passed = process.returncode == 0
        output += f"\n[exit code {process.returncode}]\n"
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        passed = False
        output += f"\n[killed after {job.timeout_s:g} s]\n"
    except BaseException:  # Ctrl-C: the job is in its own session and did not get the signal
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    return passed, output, time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run the demo, the suite and one diagnose case many times; count failures.")
    parser.add_argument("--demo", type=int, default=10, metavar="K",
                        help="runs of 'distdoctor demo --all' (default: %(default)s)")
    parser.add_argument("--suite", type=int, default=5, metavar="K",
                        help="runs of the whole test suite (default: %(default)s)")
    parser.add_argument("--explore", type=int, default=1, metavar="K",
                        help="runs of the property tests with fresh random examples, ten "
                             "times as many (--hypothesis-profile=explore; default: "
                             "%(default)s)")
    parser.add_argument("--diagnose", type=int, default=50, metavar="K",
                        help="runs of the diagnose case (default: %(default)s)")
    parser.add_argument("--stragglers", type=int, default=0, metavar="K",
                        help="runs of each straggler example and of the healthy loop on 4 "
                             "ranks, each judged by the rank named (default: %(default)s)")
    parser.add_argument("--expect-straggler", metavar="SCRIPT", choices=sorted(STRAGGLERS),
                        help=argparse.SUPPRESS)  # one such run: what each soak run starts
    parser.add_argument("--case", default=DEFAULT_CASE,
                        help="diagnose's arguments (default: %(default)s)")
    parser.add_argument("--load", action="store_true",
                        help="keep every core busy with a hog process for the whole soak")
    parser.add_argument("--max-hours", type=float, default=4.0,
                        help="the hogs end by themselves after this long (default: %(default)s)")
    parser.add_argument("--keep", default="soak-failures", metavar="DIR",
                        help="where the output of failing runs goes (default: %(default)s)")
    parser.add_argument("--smoke", action="store_true",
                        help="the suite's run: one quick diagnose case, nothing else")
    args = parser.parse_args(argv)
    if args.expect_straggler:
        return expect_straggler(args.expect_straggler)
    if args.smoke:
        args.demo = args.suite = args.explore = 0
        args.diagnose, args.case = 1, "--strategy ddp --fault sum-without-mean --world-size 2"
    if min(args.demo, args.suite, args.diagnose, args.explore, args.stragglers) < 0 \
            or args.max_hours <= 0:
        parser.error("counts must be zero or more and --max-hours positive")
    todo = jobs(args)
    keep = ROOT / args.keep
    load = start_load(args.max_hours * 3600) if args.load else []
    print(f"soak: {', '.join(f'{j.name} x{j.runs}' for j in todo)}"
          + (f", under load ({len(load)} hog processes)" if load else ""), flush=True)
    results: dict[str, list[bool]] = {}
    try:
        for job in todo:
            outcomes = results.setdefault(job.name, [])
            for index in range(1, job.runs + 1):
                passed, output, seconds = run_once(job)
                outcomes.append(passed)
                note = ""
                if not passed:
                    keep.mkdir(exist_ok=True)
                    path = keep / f"{job.name.split()[0]}-{index}.log"
                    path.write_text(output)
                    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                    note = f"  FAILED, output in {shown}"
                print(f"  {job.name} [{index}/{job.runs}] {seconds:.1f} s{note}", flush=True)
    finally:
        stop(load)
    print("\nsoak results" + (" (under load)" if args.load else ""))
    for name, outcomes in results.items():
        print(f"  {name}: {sum(outcomes)} of {len(outcomes)} passed")
    return 0 if all(all(o) for o in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
