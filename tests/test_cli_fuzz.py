"""Every sub-command fed generated argument lists: flags it has and flags it has not,
numbers negative, huge, not numbers, empty, unicode, paths that do not exist. Whatever
comes, no traceback: exit 0, 1 or 2, and 2 with one line naming the command whenever it
says "error:".

Input that passes every check would start ranks, a command, or read a live process; that
is where this test stops it (the pool's, the launchers' and attach's entry points raise
here), since what is under test is the
checking of input, not the training the suite tests elsewhere.
"""

from __future__ import annotations

import argparse

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distdoctor.cli.main import build_parser, main

pytestmark = pytest.mark.tier("warm")

TRIED = {"argv": 0, "refused": 0, "would run": 0}


class WouldRun(Exception):
    """Input valid enough to start ranks."""


def _commands() -> dict[tuple[str, ...], list[str]]:
    """(command words) -> the option strings its parser knows, from the parser itself."""
    found: dict[tuple[str, ...], list[str]] = {}

    def walk(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> None:
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subparsers:
            found[words] = [o for a in parser._actions for o in a.option_strings
                            if o not in ("-h", "--help")]
        for action in subparsers:
            for name, sub in action.choices.items():
                walk(sub, words + (name,))

    walk(build_parser(), ())
    return found


COMMANDS = _commands()
VALUES = ["0", "-1", "1", "2", "3", "4", "8", "1e309", "nan", "inf", "-inf", "", " ", "é",
          "ünïcødé", "99999999999999999999", "0.5", "abc", "/nonexistent/dir", "-", "--",
          "2-3", "6-1", "ddp", "zero3", "pipe-1f1b", "sum-without-mean", "allreduce",
          "collective_impls:ring_allreduce", "nope:nope", "rank_raises.py", "missing.py"]


@st.composite
def argvs(draw) -> list[str]:
    words = draw(st.sampled_from(sorted(COMMANDS)))
    options = COMMANDS[words] + ["--no-such-flag"]
    argv = list(words)
    for _ in range(draw(st.integers(0, 4))):
        argv.append(draw(st.sampled_from(options)))
        if draw(st.booleans()):
            argv.append(draw(st.sampled_from(VALUES) | st.text(max_size=6)))
    if draw(st.booleans()):
        argv.append(draw(st.sampled_from(VALUES)))
    return argv


@pytest.fixture
def stop_before_ranks(monkeypatch):
    from distdoctor.cli import exercise
    from distdoctor.launch import pool
    from distdoctor.userjob.attaching import attach
    from distdoctor.userjob.launching import command, launcher

    def would_run(*args, **kwargs):
        raise WouldRun

    monkeypatch.setattr(pool.RankPool, "start", would_run)
    monkeypatch.setattr(pool.RankPool, "run", would_run)
    monkeypatch.setattr(launcher, "run_script", would_run)
    monkeypatch.setattr(command, "run_command", would_run)  # run -- COMMAND
    monkeypatch.setattr(attach, "find", would_run)  # a live process's stacks
    monkeypatch.setattr(exercise, "_start", would_run)  # an exercise written to a folder


def test_every_sub_command_is_reached_by_the_generator():
    assert {words[0] for words in COMMANDS} == {
        "train", "diagnose", "demo", "pipeline", "run", "analyze", "check-collective",
        "collectives", "memory", "faults", "attach", "resume-check", "exercise"}


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(argv=argvs())
def test_generated_arguments_never_end_in_a_traceback(stop_before_ranks, capsys, argv):
    TRIED["argv"] += 1
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals and --help
        code = exc.code
    except WouldRun:
        TRIED["would run"] += 1
        capsys.readouterr()
        return
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, argv
    assert code in (0, 1, 2), (argv, code)
    if "error:" in err:
        TRIED["refused"] += 1
        assert code == 2, (argv, err)
        assert err.count("\n") == 1, (argv, err)
        named = "distdoctor " + " ".join(a for a in argv[:2] if not a.startswith("-"))
        assert err.startswith(f"distdoctor {argv[0]}") or err.startswith(named), (argv, err)


def test_the_search_tried_what_it_says():
    if TRIED["argv"] == 0:
        pytest.skip("the argument search did not run in this session")
    print(f"\ntried {TRIED['argv']} generated argument lists: {TRIED['refused']} refused "
          f"with one line and exit 2, {TRIED['would run']} valid enough to start ranks, "
          f"none with a traceback")
    assert TRIED["argv"] >= 100
