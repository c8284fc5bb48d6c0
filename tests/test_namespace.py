"""distdoctor lives beside a user's code: everything it installs is under ``distdoctor``.

A throwaway user project with packages of its own named ``checks``, ``faults``, ``harness``
and ``tests`` (common names; before the one namespace, the user's ``checks`` shadowed ours
and the diagnosis died with ``module 'checks' has no attribute 'run_all'``), and
``pythonpath = ["."]`` in its pytest settings. Its test run, ``distdoctor run`` on its
script and a clean interpreter are each checked in a subprocess, as a user meets them.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.tier("e2e")

RUN_TIMEOUT = 240  # seconds for one subprocess; each finishes in well under 30

USER_PACKAGE = 'WHOSE = "the user\'s {name}"\n'

USER_TESTS = '''
import pytest
import torch
import torch.distributed as dist
from torch import nn

import checks  # the user's own
from distdoctor.testing import assert_trains_like_one_process


@pytest.mark.world_size(2)
def test_users_checks_on_the_ranks(rank, world_size):
    import faults, harness
    assert (checks.WHOSE, faults.WHOSE, harness.WHOSE) == (
        "the user's checks", "the user's faults", "the user's harness")
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    assert t.item() == 1.0


def build():
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def step_summing(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)  # BUG: never divided by the world size
    optimizer.step()


_data = torch.Generator().manual_seed(1)
BATCHES = [(torch.randn(8, 4, generator=_data), torch.randn(8, 1, generator=_data))
           for _ in range(2)]


def test_summed_gradients():
    assert checks.WHOSE == "the user's checks"
    assert_trains_like_one_process(build, step_summing, BATCHES, world_size=2)
'''

USER_SCRIPT = '''
import torch
import torch.distributed as dist
from torch import nn

import checks  # the user's own

dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} imports {checks.WHOSE}")
torch.manual_seed(0)
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.randn(32, 8, generator=torch.Generator().manual_seed(dist.get_rank()))
for step in range(4):
    optimizer.zero_grad()
    model(data[step * 8:(step + 1) * 8]).pow(2).mean().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)  # BUG: summed, never divided by the world size
    optimizer.step()
dist.destroy_process_group()
'''


@pytest.fixture(scope="module")
def user_project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("namespace") / "project"
    for name in ("checks", "faults", "harness", "tests"):
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text(USER_PACKAGE.format(name=name))
    (root / "tests" / "test_user.py").write_text(USER_TESTS)
    (root / "train.py").write_text(USER_SCRIPT)
    (root / "pyproject.toml").write_text(textwrap.dedent('''
        [tool.pytest.ini_options]
        pythonpath = ["."]
    '''))
    return root


def test_a_users_own_checks_package_does_not_break_the_plugin(user_project):
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           "tests/test_user.py", "--junitxml", "report.xml"],
                          cwd=user_project, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output  # the summing test fails, on purpose
    cases = {case.get("name"): case for case in
             ET.parse(user_project / "report.xml").iter("testcase")}
    assert list(cases["test_users_checks_on_the_ranks"]) == [], output
    failure = cases["test_summed_gradients"].find("failure")
    assert failure is not None, output
    text = (failure.get("message") or "") + (failure.text or "")
    assert "has no attribute" not in text
    assert "cause: sum-without-mean" in text and "2.00x" in text, text


def test_distdoctor_run_on_a_script_importing_its_own_checks(user_project):
    done = subprocess.run([sys.executable, "-m", "distdoctor", "run", "--nproc-per-node", "2",
                           "train.py"], cwd=user_project, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "rank 0 imports the user's checks" in output
    assert "rank 1 imports the user's checks" in output
    summing = next(n for n, line in enumerate(USER_SCRIPT.splitlines(), 1) if "BUG" in line)
    assert "FAILED: sum-without-mean (ranks 0, 1)" in output, output
    assert f"look at: train.py:{summing}" in output, output


@pytest.mark.parametrize("name", ["checks", "faults", "harness"])
def test_distdoctor_installs_no_generic_top_level_name(tmp_path, name):
    """In a clean interpreter, outside the checkout, only ``distdoctor`` is ours."""
    done = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert done.returncode == 1 and f"No module named '{name}'" in done.stderr
    ours = subprocess.run([sys.executable, "-c", f"import distdoctor.{name}"
                           if name != "harness" else "import distdoctor"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert ours.returncode == 0, ours.stderr


def test_every_package_folder_is_installed():
    """pyproject.toml lists the packages by hand (one name mapped onto three folders): a new
    folder with an ``__init__.py`` must be listed, or an installed distdoctor lacks it."""
    import tomllib

    root = Path(__file__).resolve().parent.parent
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"harness": "distdoctor", "checks": "distdoctor.checks",
               "faults": "distdoctor.faults"}
    assert setuptools["package-dir"] == {name: folder for folder, name in folders.items()}
    found = set()
    for folder, name in folders.items():
        for init in (root / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(root / folder).parts
            found.add(".".join((name, *parts)))
    assert set(setuptools["packages"]) == found
