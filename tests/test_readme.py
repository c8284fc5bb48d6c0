"""The README as a newcomer reads it: the set-up first, then within the first screen one
command for each of the three people it is for, and links that lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.tier("unit")

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
FIRST_SCREEN = "\n".join(README.splitlines()[:66])


def test_it_opens_with_the_two_commands_that_set_everything_up():
    assert README.startswith("# distdoctor\n\n```\nmake demo\nmake test\n```\n")


def test_each_of_the_three_paths_has_its_command_on_the_first_screen():
    paths = ["**My job hangs or crashes.**", "**I want tests of my own distributed code in CI.**",
             "**I teach this.**"]
    at = [FIRST_SCREEN.index(path) for path in paths]
    assert at == sorted(at)
    hangs, ci, teach = (FIRST_SCREEN[a:b] for a, b in zip(at, at[1:] + [len(FIRST_SCREEN)]))
    assert "distdoctor run --nproc-per-node" in hangs and "distdoctor analyze" in hangs
    assert "@pytest.mark.world_size" in ci and "--report" in ci and "exit codes" in ci
    for command in ("distdoctor faults", "distdoctor demo", "distdoctor pipeline simulate",
                    "distdoctor memory", "distdoctor collectives"):
        assert command in teach


def test_every_link_leads_to_a_file_and_every_doc_is_linked():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    assert links and all((ROOT / link).is_file() for link in links)
    assert {p.name for p in (ROOT / "docs").glob("*.md")} == \
        {Path(link).name for link in links if link.startswith("docs/") and link.endswith(".md")}


def test_the_words_a_newcomer_meets_first_are_explained_or_absent():
    for term in ("knob", "run spec", "RunSpec", "evidence pool"):
        assert term not in FIRST_SCREEN
