"""Flight Recorder dumps at cluster scale: ``distdoctor analyze`` against torch's own reader
(``python -m torch.distributed.flight_recorder.fr_trace``) on the same files, in one run.

For 1,024, 4,096 and 16,384 ranks, ``frdumps.py`` writes an nccl job's dumps in torch's
schema (2,000 entries per rank, the ring buffer wrapped; tensor-parallel groups of 8 and
data-parallel groups across them, plus the default group; pickles as torch writes them),
with one injected cause: rank ``world // 2 + 5`` makes an extra all-reduce on its
data-parallel group, and the job hangs. Each tool is run as a user runs it, in a fresh
process; its wall time and peak memory (the resident size of its whole process tree,
sampled every 0.1 s) are measured, and its verdict read: distdoctor's from its JSON
report, fr_trace's as the first report it prints. fr_trace runs under a time limit and an
address-space cap; a size it cannot finish is said, and it is not run on larger ones.

    python bench/flight_recorder.py [--sizes 1024,4096] [--fr-limit 900]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import frdumps  # noqa: E402 (after the path is set)

SMOKE = "--smoke" in sys.argv[1:]
SIZES = (32,) if SMOKE else (1024, 4096, 16384)
ENTRIES = 200 if SMOKE else 2000
TP = 8
FR_CAP_BYTES = 18 << 30  # fr_trace's address space: it holds every dump as Python objects
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Measured:
    seconds: float
    peak_mb: float
    finished: bool  # within the limit, exit status 0 or 1
    output: str
    why: str = ""  # why it did not finish


def generate(world: int, out: str) -> tuple[float, float]:
    """The job's dumps into ``out``, on every core; (seconds, MB written)."""
    job = frdumps.Job(world, TP, ENTRIES, "extra", culprit(world))
    start = time.monotonic()
    lanes = os.cpu_count() or 1
    chunks = [range(a, min(world, a + 256)) for a in range(0, world, 256)]
    with ProcessPoolExecutor(lanes) as pool:
        list(pool.map(_write, [(job, out, c) for c in chunks]))
    size = sum(e.stat().st_size for e in os.scandir(out))
    return time.monotonic() - start, size / 1e6


def _write(args) -> None:
    job, out, ranks = args
    frdumps.write(job, out, ranks)


def culprit(world: int) -> int:
    return world // 2 + 5


def measure(command: list[str], limit: float, cap: int | None = None) -> Measured:
    """Run ``command`` to its end or ``limit``; its wall time and peak tree RSS."""
    def limited() -> None:
        os.setsid()
        if cap:
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    with tempfile.TemporaryFile() as log:
        start = time.monotonic()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   preexec_fn=limited)
        peak, why = 0, ""
        while process.poll() is None:
            peak = max(peak, _tree_rss(process.pid))
            if time.monotonic() - start > limit:
                os.killpg(process.pid, signal.SIGKILL)
                why = f"did not finish within {limit:.0f} s"
                break
            time.sleep(0.1)
        process.wait()
        seconds = time.monotonic() - start
        log.seek(0)
        output = log.read().decode(errors="replace")
    if not why and process.returncode not in (0, 1):
        last = output.strip().splitlines()[-1][:100] if output.strip() else ""
        why = "ran out of memory" if "MemoryError" in output else \
            f"stopped: {last or process.returncode}"
    return Measured(seconds, peak * PAGE / 1e6, not why, output, why)


def _tree_rss(root: int) -> int:
    """Resident pages of ``root`` and every process under it."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as stat:
                    ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/statm") as statm:
                total += int(statm.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return total


def ours(out: str, report: str) -> tuple[Measured, str, bool]:
    done = measure([sys.executable, "-m", "distdoctor", "analyze", out, "--report", report],
                   limit=3600)
    try:
        cause = json.load(open(report))["cause"]
        verdict = f"{cause['kind']} (rank{'s' * (len(cause['ranks']) > 1)} " \
                  f"{', '.join(map(str, cause['ranks']))})"
        right = cause["ranks"] == [culprit_of(out)]
    except (OSError, ValueError, KeyError, TypeError):
        verdict, right = "no report", False
    return done, verdict, right


def culprit_of(out: str) -> int:
    return culprit(len(os.listdir(out)))


def theirs(out: str, limit: float) -> tuple[Measured, str, bool]:
    done = measure([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", out,
                    "-p", "nccl_trace_rank_"], limit=limit, cap=FR_CAP_BYTES)
    missing = re.findall(r"missing ranks: \{([\d, ]*)\}", done.output)
    culprits = re.findall(r"[Cc]ulprit[^\n]*", done.output)
    if not done.finished:
        return done, done.why, False
    if missing:
        first = sorted(int(r) for r in missing[0].split(",") if r.strip())
        return done, f"first report: missing ranks {first}", first == [culprit_of(out)]
    if culprits:
        return done, culprits[0][:60], str(culprit_of(out)) in culprits[0]
    return done, "no mismatch reported", False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--fr-limit", type=float, default=120 if SMOKE else 900)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"Flight Recorder dumps: {ENTRIES} entries per rank, TP groups of {TP}, an extra "
          f"all-reduce on rank world/2+5's data-parallel group; {os.cpu_count()} cores",
          flush=True)
    print(f"{'ranks':>6} {'files':>9} {'written':>8}   {'distdoctor analyze':<44} "
          f"{'fr_trace':<50} ratio", flush=True)
    fr_gave_up = ""
    last = ""
    for world in sizes:
        root = tempfile.mkdtemp(prefix="frbench-")
        try:
            out = os.path.join(root, "dumps")
            os.mkdir(out)
            written_s, written_mb = generate(world, out)
            mine, verdict, right = ours(out, os.path.join(root, "report.json"))
            mine_text = (f"{mine.seconds:6.1f} s {mine.peak_mb:7.0f} MB  {verdict}"
                         f"{' right' if right else ' WRONG'}")
            if fr_gave_up:
                other_text, ratio = f"not run ({fr_gave_up} at a smaller size)", "-"
            else:
                other, other_verdict, other_right = theirs(out, args.fr_limit)
                if other.finished:
                    other_text = (f"{other.seconds:6.1f} s {other.peak_mb:7.0f} MB  "
                                  f"{other_verdict}{' right' if other_right else ' wrong'}")
                    ratio = f"{other.seconds / mine.seconds:.1f}x"
                else:
                    other_text = f"{other.why} ({other.peak_mb:.0f} MB at the end)"
                    ratio = f">{other.seconds / mine.seconds:.1f}x"
                    fr_gave_up = other.why
            last = (f"{world:>6} {written_mb:7.0f} MB {written_s:6.1f} s   {mine_text:<44} "
                    f"{other_text:<50} {ratio}")
            print(last, flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return 0 if last else 1


if __name__ == "__main__":
    sys.exit(main())
