"""The same small distributed tests through the distdoctor pytest plugin and as torch's
``MultiProcessTestCase``, side by side in one run.

Each test is one all-reduce of 8 floats at world size 4 and checks the sum. Both files are
written to a temporary directory and run by pytest in a subprocess; a timing plugin records
how long pytest spends on each test (set-up, call and teardown). The plugin's first test
forms its warm pool and is reported apart; the per-test figure is over the tests after it.
``MultiProcessTestCase`` spawns four fresh ranks per test (it has no warm pool), so all of
its tests count. Targets: at most 20 ms per test through the plugin once the pool is warm,
and at least 50x faster per test than ``MultiProcessTestCase``.

    python bench/pytest_plugin.py [--tests 30] [--mptc-tests 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORLD = 4

PLUGIN_TEST = """
@pytest.mark.world_size({world})
def test_{index:02d}(rank):
    t = torch.full((8,), float(rank))
    dist.all_reduce(t)
    assert t.tolist() == [{total}.0] * 8
"""

MPTC_HEAD = """import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase


class AllReduce(MultiProcessTestCase):
    @property
    def world_size(self):
        return {world}

    def setUp(self):
        super().setUp()
        self._spawn_processes()
"""

MPTC_TEST = """
    def test_{index:02d}(self):
        dist.init_process_group("gloo", init_method=f"file://{{self.file_name}}",
                                rank=self.rank, world_size=self.world_size)
        t = torch.full((8,), float(self.rank))
        dist.all_reduce(t)
        assert t.tolist() == [{total}.0] * 8
        dist.destroy_process_group()
"""

TIMER = """import json, os, time
import pytest

_times = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    start = time.perf_counter()
    yield
    _times[item.name] = time.perf_counter() - start


def pytest_sessionfinish(session):
    with open(os.environ["BENCH_TIMES"], "w") as out:
        json.dump(_times, out)
"""


def run(directory: Path, test_file: str, *options: str) -> tuple[dict[str, float], float]:
    """Per-test seconds and pytest's whole wall time for one file."""
    import time

    times = directory / f"{test_file}.json"
    env = dict(os.environ, BENCH_TIMES=str(times), PYTHONPATH=str(directory))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "bench_timer", *options, test_file], cwd=directory, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{test_file} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return json.loads(times.read_text()), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=int, default=30, help="tests per file (default 30)")
    parser.add_argument("--mptc-tests", type=int, default=None,
                        help="MultiProcessTestCase tests (default: as many as --tests)")
    parser.add_argument("--smoke", action="store_true",
                        help="the suite's run: 2 plugin tests and 1 MultiProcessTestCase test, "
                             "at world size 2")
    args = parser.parse_args()
    world = WORLD
    if args.smoke:
        args.tests, args.mptc_tests, world = 2, 1, 2
    if args.tests < 1 or (args.mptc_tests is not None and args.mptc_tests < 1):
        parser.error("test counts must be at least 1")
    total = sum(range(world))
    with tempfile.TemporaryDirectory(prefix="distdoctor-bench-") as name:
        directory = Path(name)
        (directory / "bench_timer.py").write_text(TIMER)
        (directory / "pytest.ini").write_text("[pytest]\n")
        plugin_tests = "".join(PLUGIN_TEST.format(world=world, index=i, total=total)
                               for i in range(args.tests + 1))  # test_00 warms the pool
        (directory / "test_plugin.py").write_text(
            "import pytest\nimport torch\nimport torch.distributed as dist\n" + plugin_tests)
        mptc = args.mptc_tests or args.tests
        (directory / "test_mptc.py").write_text(
            MPTC_HEAD.format(world=world) + "".join(
                MPTC_TEST.format(index=i, total=total) for i in range(mptc)))
        print(f"{args.tests} all-reduce tests at world size {world} through the plugin ...",
              flush=True)
        plugin, plugin_wall = run(directory, "test_plugin.py")
        print(f"{mptc} as MultiProcessTestCase tests (about 7 s each here) ...", flush=True)
        torch_times, torch_wall = run(directory, "test_mptc.py", "-p", "no:distdoctor")
    warm = [plugin[f"test_{i:02d}"] for i in range(1, args.tests + 1)]
    spawned = list(torch_times.values())
    per_plugin, per_torch = statistics.mean(warm), statistics.mean(spawned)
    print(f"\nplugin: first test (forms the pool) {plugin['test_00'] * 1000:.0f} ms; "
          f"then per test mean {per_plugin * 1000:.1f} ms, median "
          f"{statistics.median(warm) * 1000:.1f} ms, max {max(warm) * 1000:.1f} ms "
          f"(pytest's whole run {plugin_wall:.1f} s)")
    print(f"MultiProcessTestCase: per test mean {per_torch * 1000:.0f} ms, median "
          f"{statistics.median(spawned) * 1000:.0f} ms (pytest's whole run {torch_wall:.1f} s)")
    ratio = per_torch / per_plugin
    print(f"per test, the plugin is {ratio:.0f}x faster "
          f"(target: at most 20 ms {'met' if per_plugin <= 0.020 else 'MISSED'}; "
          f"at least 50x {'met' if ratio >= 50 else 'MISSED'})")


if __name__ == "__main__":
    main()
